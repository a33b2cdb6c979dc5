#include "core/parse_number.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace morph {

std::optional<int64_t> parseInt64(std::string_view s) {
  if (s.empty()) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parseDouble(std::string_view s) {
  // strtod skips leading blanks and accepts hex and "inf"; refuse those first.
  if (s.empty()) return std::nullopt;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E')) return std::nullopt;
  const std::string text(s);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

int64_t parseInt64Or(std::string_view s, const std::string& what, int64_t lo, int64_t hi) {
  const auto v = parseInt64(s);
  if (!v || *v < lo || *v > hi) {
    std::ostringstream os;
    os << what << " '" << s << "': expected an integer in [" << lo << ", " << hi << "]";
    throw InputError(os.str());
  }
  return *v;
}

double parseDoubleOr(std::string_view s, const std::string& what, double lo, double hi) {
  const auto v = parseDouble(s);
  if (!v || *v < lo || *v > hi) {
    std::ostringstream os;
    os << what << " '" << s << "': expected a number in [" << lo << ", " << hi << "]";
    throw InputError(os.str());
  }
  return *v;
}

}  // namespace morph
