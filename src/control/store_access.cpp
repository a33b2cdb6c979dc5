// Store values and the connection to a manager (store_access.h).
#include "control/store_access.h"


namespace morph {
namespace detail {

std::string getString(c10d::Store& s, const std::string& key) {
  auto v = s.get(key);
  return std::string(v.begin(), v.end());
}
int64_t getInt(c10d::Store& s, const std::string& key) { return parseStoreInt(key, getString(s, key)); }

void setString(c10d::Store& s, const std::string& key, const std::string& value) {
  s.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

c10::intrusive_ptr<StoreClient> connectToManager(const std::string& join, const std::string& token,
                                                 const std::string& role, double timeout_s) {
  return c10::make_intrusive<StoreClient>(dialManager(join, token, role, timeout_s));
}

}  // namespace detail
}  // namespace morph
