#include "core/job_spec.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>
#include <toml++/toml.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/npy.h"

namespace morph {
namespace {

const char* typeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

// Reads keys from the parsed document, remembering which were used so that
// anything left over is reported as unknown.
class Reader {
 public:
  Reader(const toml::table& root, std::string origin) : root_(root), origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw InputError(origin_ + ": key '" + key + "': " + what);
  }

  const toml::node* find(const std::string& key) {
    used_.insert(key);
    return root_.at_path(key).node();
  }

  bool has(const std::string& key) { return find(key) != nullptr; }

  std::string str(const std::string& key, const std::string& def, bool required = false) {
    const toml::node* n = find(key);
    if (!n) {
      if (required) fail(key, "missing; expected a string");
      return def;
    }
    if (!n->is_string()) fail(key, std::string("expected a string, got ") + typeName(*n));
    return n->as_string()->get();
  }

  int64_t integer(const std::string& key, int64_t def, int64_t lo, int64_t hi,
                  bool required = false) {
    const toml::node* n = find(key);
    if (!n) {
      if (required) fail(key, "missing; expected an integer");
      return def;
    }
    if (n->is_floating_point()) {
      // 1e8 or 100.0 is a float in TOML: say how to write it as an integer.
      const double f = n->as_floating_point()->get();
      std::ostringstream os;
      os << "expected an integer, got the number " << f;
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 9e18)
        os << " (write it without a decimal point or exponent: " << static_cast<int64_t>(f) << ")";
      fail(key, os.str());
    }
    if (!n->is_integer()) fail(key, std::string("expected an integer, got ") + typeName(*n));
    int64_t v = n->as_integer()->get();
    if (v < lo || v > hi) {
      std::ostringstream os;
      os << "expected an integer in [" << lo << ", " << hi << "], got " << v;
      fail(key, os.str());
    }
    return v;
  }

  double number(const std::string& key, double def, double lo, double hi, bool required = false) {
    const toml::node* n = find(key);
    if (!n) {
      if (required) fail(key, "missing; expected a number");
      return def;
    }
    double v;
    if (n->is_integer()) {
      v = static_cast<double>(n->as_integer()->get());
    } else if (n->is_floating_point()) {
      v = n->as_floating_point()->get();
    } else {
      fail(key, std::string("expected a number, got ") + typeName(*n));
    }
    if (!std::isfinite(v) || v < lo || v > hi) {
      std::ostringstream os;
      os << "expected a number in [" << lo << ", " << hi << "], got " << v;
      fail(key, os.str());
    }
    return v;
  }

  bool boolean(const std::string& key, bool def) {
    const toml::node* n = find(key);
    if (!n) return def;
    if (!n->is_boolean()) fail(key, std::string("expected a boolean, got ") + typeName(*n));
    return n->as_boolean()->get();
  }

  std::vector<int64_t> intList(const std::string& key, std::vector<int64_t> def, int64_t lo,
                               int64_t hi) {
    const toml::node* n = find(key);
    if (!n) return def;
    const toml::array* arr = n->as_array();
    if (!arr || arr->empty())
      fail(key, std::string("expected a non-empty array of integers, got ") + typeName(*n));
    std::vector<int64_t> out;
    for (const toml::node& e : *arr) {
      if (!e.is_integer() || e.as_integer()->get() < lo || e.as_integer()->get() > hi) {
        std::ostringstream os;
        os << "expected an array of integers in [" << lo << ", " << hi << "], but element " << out.size() << " is ";
        if (e.is_integer()) os << e.as_integer()->get();
        else if (e.is_floating_point()) os << "the number " << e.as_floating_point()->get();
        else os << typeName(e);
        fail(key, os.str());
      }
      out.push_back(e.as_integer()->get());
    }
    return out;
  }

  std::vector<std::string> strList(const std::string& key) {
    const toml::node* n = find(key);
    if (!n) return {};
    const toml::array* arr = n->as_array();
    if (!arr || arr->empty()) fail(key, std::string("expected a non-empty array of strings, got ") + typeName(*n));
    std::vector<std::string> out;
    for (const toml::node& e : *arr) {
      if (!e.is_string() || e.as_string()->get().empty())
        fail(key, "expected an array of non-empty strings, but element " + std::to_string(out.size()) + " is " +
                      (e.is_string() ? std::string("empty") : std::string(typeName(e))));
      out.push_back(e.as_string()->get());
    }
    return out;
  }

  std::string choice(const std::string& key, const std::string& def,
                     const std::vector<std::string>& options, bool required = false) {
    std::string v = str(key, def, required);
    for (const auto& o : options)
      if (o == v) return v;
    std::string list;
    for (const auto& o : options) list += (list.empty() ? "\"" : ", \"") + o + "\"";
    fail(key, "expected one of " + list + ", got \"" + v + "\"");
  }

  // Every key in the document that no reader asked for is an error.
  void rejectUnknown() const { walk(root_, ""); }

 private:
  void walk(const toml::table& t, const std::string& prefix) const {
    for (const auto& [k, v] : t) {
      std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (const toml::table* sub = v.as_table()) {
        walk(*sub, key);
      } else if (!used_.count(key)) {
        throw InputError(origin_ + ": unknown key '" + key +
                         "' (docs/job_file.md lists the keys this version understands)");
      }
    }
  }

  const toml::table& root_;
  std::string origin_;
  std::set<std::string> used_;
};

void applyOverride(toml::table& root, const std::string& spec, const std::string& origin) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw InputError("--set '" + spec + "': expected key=value, e.g. --set batch.global=128");
  std::string key = spec.substr(0, eq), value = spec.substr(eq + 1);
  toml::table holder;
  try {
    holder = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    holder = toml::table{};
    holder.insert("v", value);  // a bare word is a string
  }
  toml::table* t = &root;
  std::stringstream ss(key);
  std::string part;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i].empty()) throw InputError("--set '" + spec + "': empty key part");
    toml::node* n = t->get(parts[i]);
    if (!n) {
      t->insert(parts[i], toml::table{});
      n = t->get(parts[i]);
    }
    if (!n->is_table())
      throw InputError("--set '" + spec + "': '" + parts[i] + "' in " + origin + " is not a table");
    t = n->as_table();
  }
  if (parts.empty() || parts.back().empty())
    throw InputError("--set '" + spec + "': expected key=value");
  t->insert_or_assign(parts.back(), *holder.get("v"));
  // The length of a job is given one way: overriding one replaces the other.
  if (key == "job.steps") t->erase("epochs");
  if (key == "job.epochs") t->erase("steps");
}

// An input file or folder named in the job file: a relative path is taken
// from the job file's folder, wherever `morph run` (or a worker) starts
// (docs/job_file.md, "Paths"). `origin` is the job file's path.
std::string inputPath(const std::string& origin, const std::string& given) {
  std::filesystem::path p(given);
  if (p.is_relative()) p = std::filesystem::path(origin).parent_path() / p;
  return p.lexically_normal().string();
}

// dataset = "npy": reads the four headers and the labels, checks that they
// fit together, and fills the model's input shape and class count (or,
// with `float_targets` (loss = "mse"), the target shape).
void readNpyData(Reader& r, JobSpec& j, bool float_targets, const std::string& origin) {
  DataSpec& d = j.data;
  d.train_x = inputPath(origin, r.str("data.train_x", "", true));
  d.train_y = inputPath(origin, r.str("data.train_y", "", true));
  d.test_x = inputPath(origin, r.str("data.test_x", "", true));
  d.test_y = inputPath(origin, r.str("data.test_y", "", true));
  d.mean = r.number("data.mean", 0.0, -1e30, 1e30);
  d.std = r.number("data.std", 1.0, 1e-30, 1e30);
  auto header = [&](const char* key, const std::string& path) {
    if (!std::filesystem::is_regular_file(path)) r.fail(key, "expected a .npy file, but " + path + " is missing");
    return readNpyHeader(path);
  };
  const NpyHeader tx = header("data.train_x", d.train_x), ty = header("data.train_y", d.train_y);
  const NpyHeader vx = header("data.test_x", d.test_x), vy = header("data.test_y", d.test_y);
  // int64 inputs are token ids (N, T): the model embeds them (docs/models.md, "Token data").
  if ((tx.kind == 'i') != (vx.kind == 'i'))
    throw InputError(d.test_x + ": inputs are " + vx.describe() + " but " + d.train_x + "'s are " + tx.describe() +
                     "; both splits must be token ids (int64) or both values (uint8 or float32)");
  for (const auto* x : {&tx, &vx}) {
    const std::string& p = x == &tx ? d.train_x : d.test_x;
    if (x->kind == 'i' && float_targets)
      throw InputError(p + ": inputs are int64 token ids; model.loss = \"mse\" expects uint8 or float32 inputs");
    if (x->kind == 'i' && x->shape.size() != 2)
      throw InputError(p + ": token ids of shape " + x->describe() + "; expected int64 (samples, positions)");
    if (x->shape.size() < 2)
      throw InputError(p + ": inputs have shape " + x->describe() + "; expected (samples, ...) with at least two axes");
  }
  if (std::vector<int64_t>(tx.shape.begin() + 1, tx.shape.end()) != std::vector<int64_t>(vx.shape.begin() + 1, vx.shape.end()))
    throw InputError(d.test_x + ": samples of shape " + vx.describe() + " do not match " + d.train_x + "'s " +
                     tx.describe());
  if (float_targets) {
    for (const auto& [x, y, px, py] : {std::tuple(&tx, &ty, d.train_x, d.train_y), std::tuple(&vx, &vy, d.test_x, d.test_y)}) {
      if (y->kind != 'f')
        throw InputError(py + ": targets are " + y->describe() + "; model.loss = \"mse\" expects float32 targets");
      if (y->shape[0] != x->shape[0])
        throw InputError(py + ": holds " + std::to_string(y->shape[0]) + " targets but " + px + " holds " +
                         std::to_string(x->shape[0]) + " samples");
    }
    if (std::vector<int64_t>(ty.shape.begin() + 1, ty.shape.end()) != std::vector<int64_t>(vy.shape.begin() + 1, vy.shape.end()))
      throw InputError(d.test_y + ": targets of shape " + vy.describe() + " do not match " + d.train_y + "'s " +
                       ty.describe());
    j.model.target.assign(ty.shape.begin() + 1, ty.shape.end());
    j.model.classes = 0;
    if (ty.count() == 0 && ty.shape[0] > 0) throw InputError(d.train_y + ": targets of " + ty.describe() + " hold no values");
  }
  // Labels: int64 (N), one class per sample; with token inputs (N, T),
  // int64 (N, T), one class (the next token) per position.
  const bool tokens = tx.kind == 'i';
  for (const auto& [x, y, px, py] : {std::tuple(&tx, &ty, d.train_x, d.train_y), std::tuple(&vx, &vy, d.test_x, d.test_y)}) {
    if (float_targets) break;
    if (tokens && (y->kind != 'i' || y->shape != x->shape))
      throw InputError(py + ": labels are " + y->describe() + "; with token inputs " + x->describe() + " (" + px +
                       ") expected int64 labels of the same shape (the class of every position)");
    if (!tokens && (y->kind != 'i' || y->shape.size() != 1))
      throw InputError(py + ": labels are " + y->describe() + "; expected a one-axis int64 array");
    if (y->shape[0] != x->shape[0])
      throw InputError(py + ": holds " + std::to_string(y->shape[0]) + " labels but " + px + " holds " +
                       std::to_string(x->shape[0]) + " samples");
  }
  j.model.input.assign(tx.shape.begin() + 1, tx.shape.end());
  if (tokens) {
    j.model.target = j.model.input;  // (T): T loss terms per sample
    for (const auto& [x, px] : {std::pair(&tx, d.train_x), std::pair(&vx, d.test_x)}) {
      const auto range = npyIntRange(NpyMap(px));
      if (x->count() > 0 && range.first < 0)
        throw InputError(px + ": negative token id " + std::to_string(range.first));
    }
  }
  if (j.model.input.size() == 2) j.model.input.insert(j.model.input.begin(), 1);  // (H, W): one channel
  j.data.train_size = tx.shape[0];
  j.data.test_size = vx.shape[0];
  if (float_targets) return;
  const auto train_range = npyIntRange(NpyMap(d.train_y));
  const auto test_range = npyIntRange(NpyMap(d.test_y));
  if (train_range.first < 0) throw InputError(d.train_y + ": negative label " + std::to_string(train_range.first));
  if (train_range.second > 1000000)
    throw InputError(d.train_y + ": label " + std::to_string(train_range.second) + " is implausibly large (at most 1000000 classes)");
  j.model.classes = train_range.second + 1;
  if (test_range.first < 0 || test_range.second >= j.model.classes)
    throw InputError(d.test_y + ": label " +
                     std::to_string(test_range.first < 0 ? test_range.first : test_range.second) +
                     " is outside the training labels' range [0, " + std::to_string(j.model.classes - 1) + "]");
  if (j.model.classes < 2) throw InputError(d.train_y + ": every label is 0; expected at least two classes");
}

// model.name = "torchscript": the module file (inputPath) and the digest
// of its bytes.
void readTorchScriptModel(Reader& r, JobSpec& j, const std::string& origin) {
  j.model.path = inputPath(origin, r.str("model.path", "", true));
  if (!std::filesystem::is_regular_file(j.model.path))
    r.fail("model.path", "expected a TorchScript module file (torch.jit.save), but " + j.model.path + " is missing");
  std::ifstream in(j.model.path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) r.fail("model.path", "cannot read " + j.model.path);
  const std::string bytes = ss.str();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH64(bytes.data(), bytes.size(), 0)));
  j.model.digest = hex;
}

}  // namespace

const char* toString(ReduceMode m) { return m == ReduceMode::kExact ? "exact" : "float"; }
const char* toString(SyncMode m) { return m == SyncMode::kSync ? "sync" : "wsp"; }

int64_t JobSpec::targetsPerSample() const {
  if (regression()) {
    int64_t n = 1;
    for (int64_t v : model.target) n *= v;
    return n;
  }
  if (model.name == "gpt-mini") return data.seq_len;
  // npy token labels (int64 inputs and labels (N, T)): one per position;
  // readNpyData sets model.target = (T) for them (empty otherwise).
  int64_t n = 1;
  for (int64_t v : model.target) n *= v;
  return n;
}

int64_t JobSpec::resolveSteps(int64_t train_size) const {
  if (steps > 0) return steps;
  int64_t s = static_cast<int64_t>(std::floor(epochs * static_cast<double>(train_size) /
                                              static_cast<double>(global_batch)));
  if (s < 1)
    throw InputError(file + ": key 'job.epochs': " + std::to_string(epochs) +
                     " epochs of " + std::to_string(train_size) + " samples is less than one step");
  return s;
}

JobSpec parseJob(const std::string& text, const std::string& origin,
                 const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": not valid TOML: " << e.description();
    throw InputError(os.str());
  }
  for (const auto& o : overrides) applyOverride(root, o, origin);

  Reader r(root, origin);
  JobSpec j;
  j.file = origin;
  j.name = r.str("job.name", std::filesystem::path(origin).stem().string());
  if (j.name.empty() || j.name.find('/') != std::string::npos)
    r.fail("job.name", "expected a non-empty name without '/'");
  j.seed = static_cast<uint64_t>(r.integer("job.seed", 1, 0, INT64_MAX));
  bool has_steps = r.has("job.steps"), has_epochs = r.has("job.epochs");
  if (has_steps == has_epochs)
    r.fail(has_steps ? "job.epochs" : "job.steps", "give exactly one of job.steps and job.epochs");
  if (has_steps) j.steps = r.integer("job.steps", 0, 1, INT64_MAX / 2);
  if (has_epochs) j.epochs = r.number("job.epochs", 0, 1e-9, 1e6);
  j.threads = static_cast<int>(r.integer("job.threads", 1, 1, 256));

  j.data.dataset = r.choice("data.dataset", "", {"fashion-mnist", "synthetic", "fortunes-char", "npy"}, true);
  if (j.data.dataset != "npy")
    for (const char* k : {"data.train_x", "data.train_y", "data.test_x", "data.test_y", "data.mean", "data.std"})
      if (r.has(k)) r.fail(k, "applies only to data.dataset = \"npy\"");
  if (j.data.dataset != "fortunes-char" && r.has("data.seq_len"))
    r.fail("data.seq_len", "applies only to data.dataset = \"fortunes-char\"");
  if (j.data.dataset == "fashion-mnist") {
    j.data.path = inputPath(origin, r.str("data.path", "/usr/share/datasets/fashion-mnist"));
    for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      auto p = std::filesystem::path(j.data.path) / f;
      if (!std::filesystem::is_regular_file(p))
        r.fail("data.path", "expected a folder holding Fashion-MNIST's IDX files, but " +
                                p.string() +
                                " is missing (apt-get install dataset-fashion-mnist)");
    }
    for (const char* k : {"data.train_size", "data.test_size"})
      if (r.has(k)) r.fail(k, "applies only to data.dataset = \"synthetic\"");
  } else if (j.data.dataset == "fortunes-char") {
    j.data.path = inputPath(origin, r.str("data.path", "/usr/share/games/fortunes"));
    j.data.seq_len = r.integer("data.seq_len", 64, 2, 4096);
    if (!std::filesystem::is_directory(j.data.path))
      r.fail("data.path", "expected the folder of the fortunes text files, but " + j.data.path +
                              " is missing (apt-get install fortunes)");
    for (const char* k : {"data.train_size", "data.test_size"})
      if (r.has(k)) r.fail(k, "applies only to data.dataset = \"synthetic\"");
  } else if (j.data.dataset == "npy") {
    for (const char* k : {"data.path", "data.train_size", "data.test_size"})
      if (r.has(k)) r.fail(k, "does not apply to data.dataset = \"npy\" (give data.train_x and the other files)");
    // The loss decides what the labels file holds (model.loss is checked below).
    readNpyData(r, j, r.str("model.loss", "cross_entropy") == "mse", origin);
  } else {
    j.data.train_size = r.integer("data.train_size", 4096, 1, 100000000);
    j.data.test_size = r.integer("data.test_size", 1024, 1, 100000000);
  }

  j.model.name = r.choice("model.name", "", {"mlp", "cnn", "gpt-mini", "torchscript"}, true);
  const bool script = j.model.name == "torchscript";
  if (script && r.has("model.dropout"))
    r.fail("model.dropout", "does not apply to model.name = \"torchscript\" (dropout is the module's own)");
  j.model.dropout = r.number("model.dropout", 0.0, 0.0, 0.99);
  if (!script)
    for (const char* k : {"model.path", "model.loss", "model.cuts"})
      if (r.has(k)) r.fail(k, "applies only to model.name = \"torchscript\"");
  if (script) {
    j.model.loss = r.choice("model.loss", "cross_entropy", {"cross_entropy", "mse"});
    if (j.model.loss == "mse" && j.data.dataset != "npy")
      r.fail("model.loss", "\"mse\" needs float32 targets: data.dataset = \"npy\" with a float32 data.train_y");
    readTorchScriptModel(r, j, origin);
    j.model.cuts = r.strList("model.cuts");
  }
  if (j.data.dataset == "npy" && !j.regression() && !j.model.target.empty() && !script)
    r.fail("model.name", "token data (int64 inputs in " + j.data.train_x +
                             ") needs model.name = \"torchscript\" (a module that embeds the ids)");
  const bool is_text = j.data.dataset == "fortunes-char";
  if (is_text != (j.model.name == "gpt-mini"))
    r.fail("model.name", is_text ? "data.dataset = \"fortunes-char\" needs model.name = \"gpt-mini\""
                              : "\"gpt-mini\" needs data.dataset = \"fortunes-char\"");
  if (j.model.name != "gpt-mini")
    for (const char* k : {"model.layers", "model.dim", "model.heads"})
      if (r.has(k)) r.fail(k, "applies only to model.name = \"gpt-mini\"");
  if (j.model.name == "gpt-mini") {
    j.model.layers = r.integer("model.layers", 2, 1, 64);
    j.model.dim = r.integer("model.dim", 64, 1, 8192);
    j.model.heads = r.integer("model.heads", 4, 1, 256);
    if (j.model.dim % j.model.heads != 0) {
      std::ostringstream os;
      os << "expected a divisor of model.dim = " << j.model.dim << ", got " << j.model.heads;
      r.fail("model.heads", os.str());
    }
    j.model.seq_len = j.data.seq_len;
    for (const char* k : {"model.hidden", "model.channels", "model.fc"})
      if (r.has(k)) r.fail(k, "does not apply to model.name = \"gpt-mini\"");
  } else if (script) {
    for (const char* k : {"model.hidden", "model.channels", "model.fc"})
      if (r.has(k)) r.fail(k, "does not apply to model.name = \"torchscript\" (the module file is the model)");
  } else if (j.model.name == "mlp") {
    j.model.hidden = r.intList("model.hidden", {512, 512}, 1, 1 << 20);
    for (const char* k : {"model.channels", "model.fc"})
      if (r.has(k)) r.fail(k, "applies only to model.name = \"cnn\"");
  } else {
    if (r.has("model.hidden")) r.fail("model.hidden", "applies only to model.name = \"mlp\"");
    j.model.channels = r.intList("model.channels", {32, 64}, 1, 4096);
    if (j.model.channels.size() != 2) r.fail("model.channels", "expected two integers, e.g. [32, 64]");
    j.model.fc = r.integer("model.fc", 128, 1, 1 << 20);
    const auto& in = j.model.input;
    if (in.size() != 3 || in[1] % 4 != 0 || in[2] % 4 != 0) {
      std::string shape;
      for (int64_t v : in) shape += (shape.empty() ? "" : ", ") + std::to_string(v);
      r.fail("model.name", "\"cnn\" needs image samples (C, H, W) or (H, W) with H and W multiples of 4; the data's samples are (" +
                               shape + ")");
    }
  }

  j.global_batch = r.integer("batch.global", 0, 1, 1 << 24, true);
  j.virtual_nodes = r.integer("batch.virtual_nodes", 1, 1, 1 << 24);
  if (j.global_batch % j.virtual_nodes != 0) {
    std::ostringstream os;
    os << "expected a divisor of batch.global = " << j.global_batch << ", got " << j.virtual_nodes;
    r.fail("batch.virtual_nodes", os.str());
  }

  auto& o = j.optim;
  o.name = r.choice("optim.name", "sgd", {"sgd", "adamw"});
  o.lr = r.number("optim.lr", 0.05, 0.0, 1e6);
  o.momentum = r.number("optim.momentum", 0.0, 0.0, 1.0 - 1e-12);
  o.nesterov = r.boolean("optim.nesterov", false);
  o.weight_decay = r.number("optim.weight_decay", 0.0, 0.0, 1e6);
  o.beta1 = r.number("optim.beta1", 0.9, 0.0, 1.0 - 1e-12);
  o.beta2 = r.number("optim.beta2", 0.999, 0.0, 1.0 - 1e-12);
  o.eps = r.number("optim.eps", 1e-8, 0.0, 1.0);
  o.warmup_steps = r.integer("optim.warmup_steps", 0, 0, INT64_MAX / 2);
  o.schedule = r.choice("optim.schedule", "constant", {"constant", "cosine"});
  o.min_lr = r.number("optim.min_lr", 0.0, 0.0, 1e6);
  o.clip_norm = r.number("optim.clip_norm", 0.0, 0.0, 1e12);
  if (o.nesterov && o.momentum == 0.0) r.fail("optim.nesterov", "needs optim.momentum > 0");

  j.reduce_mode = r.choice("reduce.mode", "exact", {"exact", "float"}) == "exact"
                      ? ReduceMode::kExact
                      : ReduceMode::kFloat;
  j.headroom_bits = static_cast<int>(r.integer("reduce.headroom_bits", 3, 0, 20));
  j.reduce_bits = static_cast<int>(r.integer("reduce.bits", 64, 32, 64));
  if (j.reduce_bits != 32 && j.reduce_bits != 64)
    r.fail("reduce.bits", "expected 32 or 64, got " + std::to_string(j.reduce_bits));
  // Each VN's quantised values stay below 2^51, so 2^12 VNs fit in int64.
  if (j.reduce_mode == ReduceMode::kExact && j.virtual_nodes > 4096)
    r.fail("batch.virtual_nodes", "exact reduction supports at most 4096 virtual nodes");

  // [sync] (docs/wsp.md). What needs the worker count (one virtual worker
  // is no WSP job) is checked by `morph run`, which knows it.
  j.sync_mode = r.choice("sync.mode", "sync", {"sync", "wsp"}) == "wsp" ? SyncMode::kWsp : SyncMode::kSync;
  if (j.sync_mode == SyncMode::kSync) {
    for (const char* k : {"sync.staleness", "sync.wave", "sync.stale_update", "sync.server_steps"})
      if (r.has(k)) r.fail(k, "applies only to sync.mode = \"wsp\"");
  } else {
    j.staleness = r.integer("sync.staleness", 0, 0, 1 << 20);
    // A wave's push sums wave x VNs quantised terms of each value, as a
    // step sums VNs: the int64 format holds 2^12 of them (docs/wsp.md).
    j.wave = r.integer("sync.wave", 1, 1, 4096);
    // "bypass_squared": as "bypass" with the factor 1 / (1 + s)^2 (wsp/own_pushes.h).
    j.stale_update = r.choice("sync.stale_update", j.stale_update, {"none", "scale", "bypass", "bypass_squared"});
    j.server_steps = r.choice("sync.server_steps", j.server_steps, {"per_minibatch", "per_clock"});
    if (j.reduce_mode != ReduceMode::kExact)
      r.fail("reduce.mode", "sync.mode = \"wsp\" needs \"exact\" (the servers' sums are fixed point, so a run replays)");
    if (j.reduce_bits != 64) r.fail("reduce.bits", "sync.mode = \"wsp\" needs 64 (a wave's sum may exceed the 32-bit bound)");
    if (j.wave * j.virtual_nodes > 4096)
      r.fail("sync.wave", "a wave sums sync.wave x batch.virtual_nodes = " + std::to_string(j.wave * j.virtual_nodes) +
                              " VN gradients of each value, and exact sums hold at most 4096; expected at most " +
                              std::to_string(4096 / j.virtual_nodes) + ", got " + std::to_string(j.wave));
    if (j.optim.clip_norm > 0.0)
      r.fail("optim.clip_norm", "does not apply to sync.mode = \"wsp\" (a server shard sees only its own parameters' norm)");
  }
  j.eval_every = r.integer("eval.every", 0, 0, INT64_MAX / 2);
  j.eval_batch = r.integer("eval.batch", 1000, 1, 1 << 20);
  j.log_every = r.integer("log.every", 10, 1, INT64_MAX / 2);
  j.checkpoint_every = r.integer("checkpoint.every", 0, 0, INT64_MAX / 2);
  j.checkpoint_keep = r.integer("checkpoint.keep", 3, 1, 1000);
  j.checkpoint_dir = r.str("checkpoint.dir", "");
  j.checkpoint_max_failures = r.integer("checkpoint.max_failures", 3, 1, 1000000);
  j.straggler_factor = r.number("elastic.straggler_factor", 2.0, 1.0, 1000.0);
  if (j.straggler_factor <= 1.0) r.fail("elastic.straggler_factor", "expected a number > 1 (e.g. 1.5), got 1");
  j.straggler_steps = r.integer("elastic.straggler_steps", 10, 1, 1000000);
  j.straggler_replan = r.boolean("elastic.straggler_replan", true);
  j.grow_interval = r.number("elastic.grow_interval", 5.0, 0.0, 86400.0);
  j.collective_timeout = r.number("elastic.collective_timeout", 0.0, 0.0, 86400.0);

  r.rejectUnknown();
  return j;
}

std::string readJobFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open job file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

JobSpec loadJobFile(const std::string& path, const std::vector<std::string>& overrides) {
  return parseJob(readJobFile(path), path, overrides);
}

}  // namespace morph
