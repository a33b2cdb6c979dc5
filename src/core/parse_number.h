// Strict numbers from text: command-line values, environment settings and
// keys of files. The whole string must be the number ("12abc", " 12", "",
// "1e3" for an integer are refused) and it must lie in the caller's range;
// std::stoi/atoi/atof accept trailing garbage or turn it into 0 silently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace morph {

// Decimal integer, optional leading '-', nothing else; nullopt when the
// text is not one or does not fit in int64.
std::optional<int64_t> parseInt64(std::string_view s);
// Finite decimal number ("1.5", "-2", "3e-4"); nullopt otherwise
// (also for "inf", "nan" and values that overflow a double).
std::optional<double> parseDouble(std::string_view s);

// The same, or an InputError naming `what` (a flag, key or variable, e.g.
// "MORPH_BUCKET_BYTES") and the range expected.
int64_t parseInt64Or(std::string_view s, const std::string& what, int64_t lo, int64_t hi);
double parseDoubleOr(std::string_view s, const std::string& what, double lo, double hi);

}  // namespace morph
