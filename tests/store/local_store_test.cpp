// The store's keys in memory (store/table.h) seen through LocalStore, the
// c10d::Store the manager and unit tests use, and AbortableStore over it.
#include "store/local_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "store/abortable_store.h"
#include "store/errors.h"

namespace {

using namespace morph;
using namespace morph::store;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

TEST(LocalStore, BehavesLikeAC10dStore) {
  Table t;
  auto s = c10::make_intrusive<LocalStore>(t, std::chrono::milliseconds(200));
  s->set("a", bytes("1"));
  EXPECT_EQ(text(s->get("a")), "1");
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -2), 3);
  EXPECT_TRUE(s->check({"a", "n"}));
  EXPECT_FALSE(s->check({"a", "missing"}));
  EXPECT_EQ(text(s->compareSet("c", {}, bytes("x"))), "x");
  EXPECT_EQ(text(s->compareSet("c", bytes("y"), bytes("z"))), "x");
  EXPECT_EQ(s->getNumKeys(), 3);
  EXPECT_TRUE(s->deleteKey("c"));
  EXPECT_FALSE(s->deleteKey("c"));
  s->set("s", bytes("abc"));
  EXPECT_THROW(s->add("s", 1), StoreError);
  EXPECT_THROW(s->get("never"), StoreError);  // its timeout
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s->set("late", bytes("v"));
  });
  s->wait({"late"}, std::chrono::seconds(5));
  later.join();
  EXPECT_EQ(text(s->get("late")), "v");
}

TEST(Table, CountsWakingWritesAndForgetsByPrefix) {
  Table t([](const std::string& key) { return key != "quiet"; });
  LocalStore s(t);
  const int64_t w0 = t.writes();
  s.set("quiet", bytes("1"));
  s.add("n", 0);  // a read of a counter
  EXPECT_EQ(t.writes(), w0);
  EXPECT_EQ(t.waitForWrite(w0, std::chrono::milliseconds(10)), w0);
  s.set("gen/1/a", bytes("1"));
  s.set("gen/1/b", bytes("1"));
  s.set("gen/10/a", bytes("1"));
  EXPECT_EQ(t.writes(), w0 + 3);
  EXPECT_EQ(t.erasePrefix("gen/1/"), 2);
  EXPECT_TRUE(s.check({"gen/10/a"}));
  EXPECT_EQ(t.erase("gen/10/a"), 1);
  EXPECT_TRUE(s.deleteKey("gen/1/a") == false);
  s.set("gone", bytes("1"));
  EXPECT_TRUE(s.deleteKey("gone"));
  EXPECT_EQ(t.writes(), w0 + 4);  // removals wake nobody
  // stop() ends a wait at once; later requests fail.
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t.stop();
  });
  EXPECT_THROW(s.wait({"never"}, std::chrono::seconds(30)), StoreError);
  stopper.join();
  EXPECT_THROW(s.set("x", bytes("1")), StoreError);
}

TEST(AbortableStore, AWaitEndsWhenTheAbortKeyAppears) {
  Table t;
  auto inner = c10::make_intrusive<LocalStore>(t, std::chrono::seconds(30));
  auto s = c10::make_intrusive<AbortableStore>(inner, "gen/3/abort", std::chrono::milliseconds(1));
  inner->set("here", bytes("1"));
  EXPECT_EQ(text(s->get("here")), "1");
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    inner->set("gen/3/abort", bytes("1"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(s->wait({"never"}), StoreError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  aborter.join();
  EXPECT_THROW(s->wait({"never"}, std::chrono::milliseconds(20)), StoreError);  // and at its own timeout
}

}  // namespace
