// Error policy (docs/errors.md):
//  - InputError: anything wrong with what the user gave us (job file, flags,
//    data files). Caught at the CLI boundary, printed, exit code 2.
//  - JobError: the job cannot go on (no worker left, non-finite gradients).
//    Exit code 3, the message names the last committed step.
//  - InternalError: a broken invariant (MORPH_CHECK). A bug in Morph.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace morph {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

class JobError : public std::runtime_error {
 public:
  explicit JobError(const std::string& what) : std::runtime_error(what) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
template <typename A, typename B>
[[noreturn]] void checkFailed(const char* file, int line, const char* expr, const A& a,
                              const B& b) {
  std::ostringstream os;
  os << file << ":" << line << ": check failed: " << expr << " (" << a << " vs " << b << ")";
  throw InternalError(os.str());
}
[[noreturn]] inline void checkFailed(const char* file, int line, const char* expr,
                                     const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": check failed: " << expr;
  if (!msg.empty()) os << ": " << msg;
  throw InternalError(os.str());
}
}  // namespace detail

}  // namespace morph

#define MORPH_CHECK(cond, msg)                                               \
  do {                                                                       \
    if (!(cond)) ::morph::detail::checkFailed(__FILE__, __LINE__, #cond, msg); \
  } while (0)

#define MORPH_CHECK_OP(a, b, op)                                                        \
  do {                                                                                  \
    const auto& morph_a_ = (a);                                                         \
    const auto& morph_b_ = (b);                                                         \
    if (!(morph_a_ op morph_b_))                                                        \
      ::morph::detail::checkFailed(__FILE__, __LINE__, #a " " #op " " #b, morph_a_, morph_b_); \
  } while (0)

#define MORPH_CHECK_EQ(a, b) MORPH_CHECK_OP(a, b, ==)
#define MORPH_CHECK_LE(a, b) MORPH_CHECK_OP(a, b, <=)
#define MORPH_CHECK_LT(a, b) MORPH_CHECK_OP(a, b, <)
