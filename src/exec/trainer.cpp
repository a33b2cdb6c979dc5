#include "exec/trainer.h"

#include <numeric>
#include <thread>

#include "core/error.h"
#include "core/model_hash.h"
#include "core/sys.h"

namespace morph {

namespace {
// Gradient bytes per all-reduce bucket: small enough that the first
// reductions start early in the last VN's backward pass, large enough that
// per-collective latency does not dominate. MORPH_BUCKET_BYTES overrides it
// (a tuning knob; it never changes results).
int64_t bucketBytes() {
  if (const char* s = std::getenv("MORPH_BUCKET_BYTES")) return std::max<int64_t>(1, std::atoll(s));
  return int64_t{25} << 20;  // as DDP
}
}  // namespace

size_t indexOf(const std::vector<torch::Tensor>& v, const torch::Tensor& t) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return i;
  MORPH_CHECK(false, "parameter not found");
}

namespace {
const std::vector<char> kNoLayers;  // buildModel's `held` for a stage-local worker before placement
}  // namespace

Trainer::Trainer(const JobSpec& job, int64_t total_steps, const Dataset& train, Communicator& comm,
                 bool stage_local)
    : job_(job),
      total_steps_(total_steps),
      comm_(&comm),
      model_(buildModel(job.model, job.seed, stage_local ? &kNoLayers : nullptr)),
      sampler_(job.seed, train.size(), job.global_batch, job.virtual_nodes),
      prefetch_(train, sampler_),
      train_(&train) {
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
  // A stage-local worker's buffer holds only the loss statistics until
  // setPipeline() gives it its stage's segments.
  std::vector<int64_t> acc_sizes = sizes;
  if (stage_local) std::fill(acc_sizes.begin(), acc_sizes.begin() + static_cast<std::ptrdiff_t>(stats_seg_), 0);
  acc_ = std::make_unique<GradAccumulator>(acc_sizes, job.reduce_mode, job.headroom_bits);
  opt_ = makeOptimizer(job.optim, params_);
  seg_ready_.assign(sizes.size(), 0);
  seg_need_.assign(sizes.size(), 1);

  const int64_t elem = job.reduce_mode == ReduceMode::kExact ? 8 : 4;
  const int64_t kBucketBytes = bucketBytes();
  for (size_t s = 0; s < bn_seg_;) {
    Bucket b{s, s};
    int64_t bytes = 0;
    while (b.end_seg < bn_seg_ && (bytes == 0 || bytes + sizes[b.end_seg] * elem <= kBucketBytes))
      bytes += sizes[b.end_seg++] * elem;
    buckets_.push_back(b);
    s = b.end_seg;
  }
  buckets_.push_back({bn_seg_, sizes.size()});

  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].register_hook([this, i](const torch::Tensor& g) { onGrad(i, g); });
  // A tied use's gradient is quantised separately and added into the owner's
  // segment: q(a) + q(b), which a pipeline can reproduce across stages.
  for (size_t l = 0; l < model_->size(); ++l)
    for (auto& [alias, owner] : model_->layer(l).tiedLeaves()) {
      const size_t i = indexOf(params_, owner);
      ++seg_need_[segOf(i)];
      alias.register_hook([this, i](const torch::Tensor& g) { onGrad(i, g); });
    }
  // One worker updates every parameter and batch norm (a pipeline stage
  // narrows these in setPipeline()).
  own_params_.resize(params_.size());
  std::iota(own_params_.begin(), own_params_.end(), size_t{0});
  own_bns_.resize(bns_.size());
  std::iota(own_bns_.begin(), own_bns_.end(), size_t{0});
  norm_owner_.assign(params_.size(), 1);
  setVnRange(0, job.virtual_nodes);
  notePeak();
}

void Trainer::abandonStep() {
  std::vector<int> scales = acc_->scales();
  for (auto& w : inflight_) graveyard_work_.push_back(std::move(w));
  inflight_.clear();
  graveyard_acc_.push_back(std::move(acc_));
  acc_ = std::make_unique<GradAccumulator>(seg_sizes_, job_.reduce_mode, job_.headroom_bits);
  acc_->setScales(scales);
  accumulating_ = launching_ = spike_now_ = false;
}

void Trainer::setVnRange(int64_t begin, int64_t end) {
  MORPH_CHECK(0 <= begin && begin <= end && end <= job_.virtual_nodes, "bad VN range");
  order_.resize(static_cast<size_t>(end - begin));
  std::iota(order_.begin(), order_.end(), begin);
}

void Trainer::setVnOrder(std::vector<int64_t> order) {
  std::vector<int64_t> a = order, b = order_;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  MORPH_CHECK(a == b, "VN order must permute the worker's VN range");
  order_ = std::move(order);
}

void Trainer::injectGradSpike(int64_t step, int64_t vn, float factor) {
  spike_step_ = step;
  spike_vn_ = vn;
  spike_factor_ = factor;
}

// Called by autograd when parameter `param`'s gradient of the current VN is
// complete (a leaf hook sees the sum over the leaf's uses; a tied alias is a
// leaf of its own).
void Trainer::onGrad(size_t param, const torch::Tensor& grad) {
  if (!accumulating_) return;
  const size_t seg = segOf(param);
  torch::Tensor g = spike_now_ ? grad * spike_factor_ : grad.contiguous();
  acc_->add(seg, g.data_ptr<float>());
  ++seg_ready_[seg];
  if (launching_) launchReadyBuckets(false);
}

// Starts the all-reduce of every bucket whose segments are all complete, in
// bucket order (every worker issues them in the same order). `all` launches
// the rest regardless (end of the backward pass).
void Trainer::launchReadyBuckets(bool all) {
  while (next_bucket_ < buckets_.size()) {
    const Bucket& b = buckets_[next_bucket_];
    if (!all)
      for (size_t s = b.first_seg; s < b.end_seg; ++s)
        if (seg_ready_[s] < seg_need_[s]) return;
    const int64_t off = acc_->segmentOffset(b.first_seg);
    const int64_t n = acc_->segmentOffset(b.end_seg - 1) + acc_->segmentSize(b.end_seg - 1) - off;
    if (acc_->mode() == ReduceMode::kExact) {
      inflight_.push_back(comm_->allreduceSumAsync(acc_->exactBuffer() + off, n));
    } else {
      inflight_.push_back(comm_->allreduceSumAsync(acc_->floatBuffer() + off, n));
    }
    ++next_bucket_;
  }
}

void Trainer::setSlowdown(double factor) {
  MORPH_CHECK(factor >= 1.0, "a slowdown factor is >= 1");
  slowdown_ = factor;
}

void Trainer::emulateSlowdown(double compute_seconds) const {
  if (slowdown_ > 1.0)
    std::this_thread::sleep_for(std::chrono::duration<double>((slowdown_ - 1.0) * compute_seconds));
}

void Trainer::runVn(int64_t vn, bool last) {
  const double t0 = nowSeconds();
  Batch b = prefetch_.take(step_, vn);
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  std::fill(seg_ready_.begin(), seg_ready_.end(), 0);
  // (b, classes), or (b, T, vocab) for a language model: one row per target.
  // The VN's own random streams: the same draws wherever and whenever it runs.
  torch::Tensor out = model_->forwardRange(b.x, 0, model_->size(), vnSeed(vn));
  out = out.reshape({-1, out.size(-1)});
  torch::Tensor y = b.y.reshape({-1});
  torch::Tensor loss = torch::nn::functional::cross_entropy(
      out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  accumulating_ = true;
  launching_ = last;
  loss.backward();
  accumulating_ = launching_ = false;
  size_t seg = bn_seg_;
  for (auto* bn : bns_) {
    acc_->add(seg++, bn->lastMean().contiguous().data_ptr<float>());
    acc_->add(seg++, bn->lastVar().contiguous().data_ptr<float>());
  }
  float stats[2];
  {
    torch::NoGradGuard no_grad;
    stats[0] = loss.item<float>();
    stats[1] = static_cast<float>(out.argmax(1).eq(y).sum().item<int64_t>());
  }
  acc_->add(stats_seg_, stats);
  emulateSlowdown(nowSeconds() - t0);
  if (last) launchReadyBuckets(true);
}

uint64_t Trainer::vnSeed(int64_t vn) const {
  return mixSeed(job_.seed, static_cast<uint64_t>(step_), static_cast<uint64_t>(vn), 0x766e);
}

void Trainer::reduceFlags(Communicator& comm, std::vector<double>& flags) {
  const size_t nflags = flags.size();
  flags.insert(flags.end(), control_.begin(), control_.end());
  comm.allreduceMax(flags.data(), static_cast<int64_t>(flags.size()));
  reduced_control_.assign(flags.begin() + static_cast<std::ptrdiff_t>(nflags), flags.end());
  flags.resize(nflags);
}

void Trainer::runLocalVns(bool first_attempt) {
  next_bucket_ = 0;
  for (size_t k = 0; k < order_.size(); ++k) {
    if (k + 1 < order_.size()) prefetch_.request(step_, order_[k + 1]);
    spike_now_ = first_attempt && step_ == spike_step_ && order_[k] == spike_vn_;
    runVn(order_[k], k + 1 == order_.size());
  }
  spike_now_ = false;
}

// The buffer's buckets are in flight (started during the last VN's
// backward). The flags and maxima decide whether their sum is usable.
void Trainer::reduceLocal(std::vector<double>& flags) {
  reduceFlags(*comm_, flags);
  for (auto& w : inflight_) w->wait();
  inflight_.clear();
}

StepStats Trainer::step() {
  MORPH_CHECK_LT(step_, total_steps_);
  StepStats st;
  st.step = step_;
  st.lr = learningRate(job_.optim, step_, total_steps_);
  const double t0 = nowSeconds();
  for (st.attempts = 1;; ++st.attempts) {
    acc_->beginStep();
    if (pipelined()) runStageSchedule(st.attempts == 1); else runLocalVns(st.attempts == 1);
    const double r0 = nowSeconds();
    std::vector<double> flags = acc_->flagsAndMax();
    if (pipelined()) reducePipeline(flags); else reduceLocal(flags);
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
  if (!pipelined() && !order_.empty() && step_ + 1 < total_steps_) prefetch_.request(step_ + 1, order_.front());

  // Means over all loss terms of the step (samples x targets per sample).
  // A pipeline stage reads and updates its own parameters and batch norms.
  const double B = static_cast<double>(job_.global_batch * job_.targetsPerSample());
  const double V = static_cast<double>(job_.virtual_nodes);
  for (size_t i : own_params_) {
    torch::Tensor& g = params_[i].mutable_grad();
    if (!g.defined()) g = torch::empty_like(params_[i]);
    acc_->read(segOf(i), B, g.data_ptr<float>());
  }
  for (size_t k : own_bns_) {
    torch::Tensor mean = torch::empty({bns_[k]->channels()}), var = torch::empty({bns_[k]->channels()});
    acc_->read(bn_seg_ + 2 * k, V, mean.data_ptr<float>());
    acc_->read(bn_seg_ + 2 * k + 1, V, var.data_ptr<float>());
    bns_[k]->commitRunningStats(mean, var);
  }
  st.loss = acc_->readScalar(stats_seg_, 0) / B;
  st.train_accuracy = acc_->readScalar(stats_seg_, 1) / B;
  if (job_.optim.clip_norm > 0.0) {
    // Every tensor's sum of squares, added in parameter order. In a
    // pipeline each comes from the stage that owns it (the others hold 0).
    std::vector<double> sq(params_.size(), 0.0);
    for (size_t i = 0; i < params_.size(); ++i)
      if (norm_owner_[i]) sq[i] = squaredNorm(params_[i].grad());
    if (pipelined()) pcomm_.world->allreduceMax(sq.data(), static_cast<int64_t>(sq.size()));
    st.grad_norm = normOfSquares(sq);
    clipToNorm(params_, st.grad_norm, job_.optim.clip_norm);
  }
  opt_->step(st.lr);  // parameters without a gradient (other stages') stay
  ++step_;
  st.seconds = nowSeconds() - t0;
  return st;
}

void Trainer::scoreBatch(const torch::Tensor& logits, const torch::Tensor& targets, double& loss, int64_t& correct) {
  torch::Tensor out = logits.reshape({-1, logits.size(-1)});
  torch::Tensor y = targets.reshape({-1});
  loss += torch::nn::functional::cross_entropy(
              out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
              .item<double>();
  correct += out.argmax(1).eq(y).sum().item<int64_t>();
}

EvalStats Trainer::evaluate(const Dataset& test, int64_t batch) {
  const double t0 = nowSeconds();
  EvalStats e = pipelined() ? evaluateStages(test, batch) : evaluateWhole(test, batch);
  e.seconds = nowSeconds() - t0;
  return e;
}

EvalStats Trainer::evaluateWhole(const Dataset& test, int64_t batch) {
  torch::NoGradGuard no_grad;
  model_->eval();
  int64_t correct = 0;
  double loss = 0.0;
  const int64_t n = test.size();
  for (int64_t i = 0; i < n; i += batch) {
    Batch b = test.range(i, std::min(n, i + batch));
    scoreBatch(model_->forward(b.x), b.y, loss, correct);
  }
  model_->train();
  const double targets = static_cast<double>(n * job_.targetsPerSample());
  return {static_cast<double>(correct) / targets, loss / targets};
}

std::string Trainer::hash() const {
  std::vector<std::pair<std::string, std::string>> layers;
  for (size_t l = 0; l < model_->size(); ++l) layers.emplace_back(model_->layerName(l), modelHash(model_->layer(l)));
  return layeredHash(layers);
}

std::string Trainer::jobId() const {
  return job_.name + "/" + job_.model.name + "/" + std::to_string(job_.seed);
}

CheckpointData Trainer::exportState() const {
  CheckpointData d;
  d.step = step_;
  d.job_id = jobId();
  d.meta = {{"format", "morph-train-state"},
            {"version", 1},
            {"step", step_},
            {"optim_steps", opt_->stepCount()},
            {"scales", acc_->scales()}};
  size_t lo = 0, hi = model_->size();
  if (pipelined()) lo = pipe_.cuts[static_cast<size_t>(pipe_.stage)], hi = pipe_.cuts[static_cast<size_t>(pipe_.stage) + 1];
  d.first_layer = static_cast<int64_t>(lo);
  for (size_t l = lo; l < hi; ++l) d.layers.emplace_back(model_->layerName(l), layerState(l));
  return d;
}

std::vector<size_t> Trainer::heldLayers() const {
  std::vector<size_t> out;
  std::vector<char> held(model_->size(), 0);
  for (size_t i : own_params_)
    for (size_t l = 0, first = 0; l < model_->size(); ++l) {
      const size_t n = model_->layer(l).parameters().size();
      if (i >= first && i < first + n) held[l] = 1;
      first += n;
    }
  if (!pipelined())
    std::fill(held.begin(), held.end(), 1);
  else
    for (size_t l = pipe_.cuts[static_cast<size_t>(pipe_.stage)]; l < pipe_.cuts[static_cast<size_t>(pipe_.stage) + 1]; ++l) held[l] = 1;
  for (size_t l = 0; l < held.size(); ++l)
    if (held[l]) out.push_back(l);
  return out;
}

NamedTensors Trainer::layerState(size_t l) const {
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

void Trainer::importState(const CheckpointData& d, bool partial) {
  if (d.job_id != jobId())
    throw InputError("checkpoint of step " + std::to_string(d.step) + " belongs to job '" + d.job_id +
                     "', not to '" + jobId() + "'");
  const size_t L = model_->size();
  const size_t first = static_cast<size_t>(d.first_layer);
  if (d.first_layer < 0 || first + d.layers.size() > L)
    throw InputError("checkpoint has layers " + std::to_string(d.first_layer) + ".." +
                     std::to_string(d.first_layer + static_cast<int64_t>(d.layers.size()) - 1) + ", the model " +
                     std::to_string(L));
  if (!partial && (first != 0 || d.layers.size() != L))
    throw InputError("checkpoint has " + std::to_string(d.layers.size()) + " layers, the model " + std::to_string(L));
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < d.layers.size(); ++k) {
    const size_t l = first + k;
    const std::string& name = model_->layerName(l);
    const NamedTensors want = layerState(l);
    const auto& [got_name, got] = d.layers[k];
    if (got_name != name || got.size() != want.size())
      throw InputError("checkpoint layer " + std::to_string(l) + " is '" + got_name + "' with " +
                       std::to_string(got.size()) + " tensors; the model's is '" + name + "' with " +
                       std::to_string(want.size()));
    for (size_t t = 0; t < want.size(); ++t) {
      const torch::Tensor& live = want[t].second;
      if (got[t].first != want[t].first || got[t].second.scalar_type() != live.scalar_type())
        throw InputError("checkpoint tensor " + name + "/" + got[t].first + " does not match the model's " +
                         name + "/" + want[t].first);
      if (live.numel() == 0 && got[t].second.numel() != 0) continue;  // a tensor this worker does not hold
      if (!got[t].second.sizes().equals(live.sizes()))
        throw InputError("checkpoint tensor " + name + "/" + got[t].first + " has shape " +
                         c10::str(got[t].second.sizes()) + ", the model's " + c10::str(live.sizes()));
      live.copy_(got[t].second);
    }
  }
  step_ = d.meta.at("step").get<int64_t>();
  opt_->setStepCount(d.meta.at("optim_steps").get<int64_t>());
  auto scales = d.meta.at("scales").get<std::vector<int>>();
  MORPH_CHECK_EQ(scales.size(), acc_->scales().size());
  acc_->setScales(scales);
  notePeak();
}

std::vector<torch::Tensor> Trainer::stateTensors() const {
  std::vector<torch::Tensor> out;
  for (const auto& [name, layer] : exportState().layers)
    for (const auto& [tname, t] : layer) out.push_back(t);
  return out;
}

std::vector<int64_t> Trainer::stateMeta() const {
  std::vector<int64_t> m{step_, opt_->stepCount()};
  for (int s : acc_->scales()) m.push_back(s);
  return m;
}

void Trainer::setStateMeta(const std::vector<int64_t>& m) {
  MORPH_CHECK_EQ(m.size(), 2 + acc_->scales().size());
  step_ = m[0];
  opt_->setStepCount(m[1]);
  acc_->setScales(std::vector<int>(m.begin() + 2, m.end()));
}

int64_t Trainer::modelBytes() const {
  int64_t bytes = 0;
  for (const auto& p : params_) bytes += p.numel() * p.element_size();
  return bytes;
}

}  // namespace morph
