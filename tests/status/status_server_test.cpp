#include "status/status_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include "core/error.h"

namespace morph {
namespace {

nlohmann::json line(int64_t step, double loss) {
  return {{"step", step}, {"loss", loss}, {"lr", 0.1}, {"samples_per_second", 100.0}, {"workers", 2},
          {"generation", 1}, {"step_seconds", 0.01}, {"unix_time", 1.0}};
}

TEST(StatusServer, SeriesStatusAndPrometheus) {
  StatusOptions o;
  o.job_name = "t\"1";
  o.steps = 10;
  StatusServer s(o);
  for (int i = 0; i < 4; ++i) s.record(line(i, 1.0 / (i + 1)));
  auto eval = line(4, 0.2);
  eval["test_accuracy"] = 0.75;
  eval["test_loss"] = 0.5;
  s.record(eval);
  s.setStatus({{"generation", 1}, {"members", {3, 4}},
               {"resizes", {{{"step", 2}, {"cause", "join"}}, {{"step", 3}, {"cause", "failure"}}}}});

  const auto series = s.seriesJson(3);
  EXPECT_EQ(series["from"], 3);
  EXPECT_EQ(series["count"], 5);
  EXPECT_EQ(series["step"], nlohmann::json({4, 5}));  // steps done after each point
  EXPECT_TRUE(series["test_accuracy"][0].is_null());
  EXPECT_EQ(series["test_accuracy"][1], 0.75);

  const auto st = s.statusJson();
  EXPECT_EQ(st["steps_committed"], 5);
  EXPECT_EQ(st["steps"], 10);
  EXPECT_EQ(st["test_accuracy"], 0.75);
  EXPECT_EQ(st["members"], nlohmann::json({3, 4}));
  EXPECT_TRUE(st["checkpoint"].is_null());

  const std::string prom = s.prometheusText();
  EXPECT_NE(prom.find("morph_steps_committed{job_name=\"t\\\"1\"} 5\n"), std::string::npos) << prom;
  EXPECT_NE(prom.find("morph_resizes_total{job_name=\"t\\\"1\",cause=\"failure\"} 1\n"), std::string::npos);
  EXPECT_NE(prom.find("morph_resizes_total{job_name=\"t\\\"1\",cause=\"leave\"} 0\n"), std::string::npos);
  EXPECT_NE(prom.find("morph_checkpoint_age_seconds{job_name=\"t\\\"1\"} NaN\n"), std::string::npos);

  httplib::Client c("127.0.0.1", s.port());
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("loss-chart"), std::string::npos);
  auto js = c.Get("/uPlot.iife.min.js");
  ASSERT_TRUE(js);
  EXPECT_GT(js->body.size(), 10000u);
  EXPECT_EQ(c.Get("/nope")->status, 404);
  EXPECT_EQ(c.Get("/metrics")->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
}

TEST(StatusServer, PortInUseNamesThePort) {
  StatusServer first(StatusOptions{});
  StatusOptions o;
  o.port = first.port();
  try {
    StatusServer second(o);
    FAIL() << "bound a port in use";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("port " + std::to_string(first.port())), std::string::npos) << e.what();
  }
}

TEST(StatusServer, TokenGuardsEveryPath) {
  StatusOptions o;
  o.host = "0.0.0.0";
  EXPECT_THROW(StatusServer{o}, InputError);  // not loopback, no token
  o.host = "127.0.0.1";
  o.token = "secret";
  StatusServer s(o);
  httplib::Client c("127.0.0.1", s.port());
  // Every route the server has (the page, its assets, the APIs, Prometheus)
  // and one it has not: without the token or with a wrong one, 401 and
  // none of the content; with it (header or query), what the route serves.
  const std::vector<std::pair<std::string, int>> paths = {
      {"/", 200},           {"/index.html", 200}, {"/uPlot.iife.min.js", 200}, {"/uPlot.min.css", 200},
      {"/uPlot.LICENSE", 200}, {"/api/status", 200}, {"/api/series", 200},     {"/api/series?since=3", 200},
      {"/metrics", 200},    {"/no-such-page", 404}};
  for (const auto& [path, served] : paths) {
    const std::string q = path.find('?') == std::string::npos ? "?" : "&";
    for (const auto& denied : {c.Get(path), c.Get(path, {{"Authorization", "Bearer wrong"}}),
                               c.Get(path, {{"Authorization", "secret"}}), c.Get(path + q + "token=secreT"),
                               c.Get(path + q + "token=")}) {
      ASSERT_TRUE(denied) << path;
      EXPECT_EQ(denied->status, 401) << path;
      EXPECT_EQ(denied->body.find("morph"), std::string::npos) << path << ": " << denied->body;
    }
    EXPECT_EQ(c.Get(path, {{"Authorization", "Bearer secret"}})->status, served) << path;
    EXPECT_EQ(c.Get(path + q + "token=secret")->status, served) << path;
  }
}

TEST(StatusServer, ParsesAddresses) {
  EXPECT_EQ(parseStatusAddress(":8080").host, "127.0.0.1");
  EXPECT_EQ(parseStatusAddress(":8080").port, 8080);
  EXPECT_EQ(parseStatusAddress("[::1]:9").host, "::1");
  EXPECT_THROW(parseStatusAddress("8080"), InputError);
  EXPECT_THROW(parseStatusAddress("x:99999"), InputError);
}

}  // namespace
}  // namespace morph
