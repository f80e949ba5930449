// The command line is a stable contract (tests and benchmarks use it): these
// tests run the rill binary and check its output and exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

const std::string kRill = RILL_BINARY;
const std::string kDefaultModel = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kLlamaGolden = std::string(RILL_SHARED_DIR) + "/goldens/hf/llama";

struct Outcome {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs a shell command line; its stdout into out, exit code (-1: killed).
Outcome run_shell(const std::string& cmd) {
  Outcome r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 65536> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Outcome run_rill(const std::string& args) {
  const std::string err_file =
      std::filesystem::temp_directory_path() / ("rill_cli_test_" + std::to_string(::getpid()) + ".err");
  Outcome r = run_shell(kRill + " 2>" + err_file + " " + args);  // args may end in a here-document
  std::ifstream in(err_file);
  r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_file);
  return r;
}

std::string join(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

nlohmann::json golden(const std::string& dir) {
  std::ifstream in(dir + "/golden.json");
  return nlohmann::json::parse(in);
}

TEST(Cli, ScorePrintsTheReferenceLogits) {
  if (!std::filesystem::exists(kLlamaGolden)) GTEST_SKIP();
  const auto g = golden(kLlamaGolden);
  const auto ids = g["prompt_ids"].get<std::vector<int>>();
  Outcome r = run_rill("score " + kLlamaGolden + " --ids " + join(ids) + " --json --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& rows = j.at("logits");
  ASSERT_EQ(rows.size(), ids.size());
  double max_err = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    ASSERT_EQ(rows[t].size(), g["logits"][t].size());
    for (size_t i = 0; i < rows[t].size(); ++i) {
      max_err = std::max(max_err, std::fabs(rows[t][i].get<double>() - g["logits"][t][i].get<double>()));
    }
  }
  EXPECT_LT(max_err, 1e-3);
}

TEST(Cli, RunPromptIdsGivesTheReferenceGreedyIds) {
  if (!std::filesystem::exists(kLlamaGolden)) GTEST_SKIP();
  const auto g = golden(kLlamaGolden);
  const auto greedy = g["greedy_ids"].get<std::vector<int>>();
  Outcome r = run_rill("run " + kLlamaGolden + " --prompt-ids " + join(g["prompt_ids"].get<std::vector<int>>()) +
                       " --max-tokens " + std::to_string(greedy.size()) + " --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("ids").get<std::vector<int>>(), greedy);
  EXPECT_EQ(j.at("finish_reason"), "length");
  EXPECT_EQ(j.at("timings").at("prompt_tokens").get<int>(), static_cast<int>(g["prompt_ids"].size()));
}

TEST(Cli, InspectDescribesTheDefaultModel) {
  if (!std::filesystem::exists(kDefaultModel)) GTEST_SKIP() << "run scripts/setup.sh";
  Outcome r = run_rill("inspect " + kDefaultModel + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["implementation"], "llama.cpu");
  EXPECT_EQ(j["n_layer"], 30);
  EXPECT_EQ(j["context_length"], 8192);
  EXPECT_EQ(j["tensor_types"]["Q4_1"], 210);
  EXPECT_EQ(j["chat_template"], true);
  EXPECT_EQ(j["parameters"].get<int64_t>(), 134515008);
  // The registry names an implementation per device; naming one builds nothing.
  Outcome cuda = run_rill("inspect " + kDefaultModel + " --json --device cuda");
  ASSERT_EQ(cuda.exit_code, 0) << cuda.err;
  EXPECT_EQ(nlohmann::json::parse(cuda.out)["implementation"], "llama.cuda");
}

TEST(Cli, SameSeedSameTokens) {
  if (!std::filesystem::exists(kDefaultModel)) GTEST_SKIP() << "run scripts/setup.sh";
  const std::string args = "run " + kDefaultModel +
                           " --prompt 'Write a haiku about rivers.' --max-tokens 12 --temperature 1.0 --json --seed ";
  Outcome a = run_rill(args + "7"), b = run_rill(args + "7");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["ids"], nlohmann::json::parse(b.out)["ids"]);
  EXPECT_FALSE(nlohmann::json::parse(a.out)["text"].get<std::string>().empty());
}

TEST(Cli, ChatReadsTurnsFromStdinAndStreamsReplies) {
  if (!std::filesystem::exists(kDefaultModel)) GTEST_SKIP() << "run scripts/setup.sh";
  // /bin/sh runs the command: a here-document feeds two turns, then /exit.
  Outcome r =
      run_rill("run " + kDefaultModel + " --max-tokens 8 --temperature 0 <<'EOF'\nHi\nWhat is 2+2?\n/exit\nEOF\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;  // one reply line per turn
  EXPECT_NE(r.err.find("chatting with"), std::string::npos) << r.err;
}

TEST(Cli, CorruptModelFileIsAClearErrorNotACrash) {
  const auto path = std::filesystem::temp_directory_path() / "rill_cli_corrupt.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out << "GGUF\x03\x00\x00\x00garbage";
  }
  Outcome r = run_rill("run " + path.string() + " --prompt-ids 1,2 --max-tokens 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(path.string()), std::string::npos) << r.err;
  std::filesystem::remove(path);

  Outcome missing = run_rill("inspect /nonexistent/model.gguf");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/nonexistent/model.gguf"), std::string::npos) << missing.err;
}

// Runs `cmd` with sh in `dir`; stdout and stderr merged into out.
Outcome run_in(const std::filesystem::path& dir, const std::string& cmd) {
  return run_shell("cd '" + dir.string() + "' && " + cmd + " 2>&1");
}

TEST(Cli, DefaultModelIsFoundUnderTheInstallPrefixAndXdgDataHomeOrTheSearchIsNamed) {
  namespace fs = std::filesystem;
  // An installed layout away from the repository: PREFIX/bin/rill.
  const fs::path root = fs::temp_directory_path() / ("rill_default_model_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "prefix" / "bin");
  fs::create_directories(root / "home");
  fs::copy_file(kRill, root / "prefix" / "bin" / "rill");
  const std::string rill = "env -u RILL_MODEL -u XDG_DATA_HOME HOME='" + (root / "home").string() + "' " +
                           (root / "prefix" / "bin" / "rill").string() + " inspect --json";
  Outcome missing = run_in(root, rill);
  EXPECT_EQ(missing.exit_code, 1) << missing.out;
  for (const fs::path& place :
       {root / "models", root / "prefix" / "models", root / "prefix" / "share" / "rill" / "models",
        root / "home" / ".local" / "share" / "rill" / "models"}) {
    EXPECT_NE(missing.out.find((place / "SmolLM2-135M-Instruct.Q4_1.gguf").string()), std::string::npos)
        << place << " not named in: " << missing.out;
  }
  // ~/.local/share/rill/models (XDG's default data home).
  fs::create_directories(root / "home" / ".local" / "share" / "rill" / "models");
  fs::create_symlink(kDefaultModel,
                     root / "home" / ".local" / "share" / "rill" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf");
  Outcome xdg = run_in(root, rill);
  EXPECT_EQ(xdg.exit_code, 0) << xdg.out;
  EXPECT_NE(xdg.out.find(".local/share/rill/models"), std::string::npos) << xdg.out;
  // PREFIX/share/rill/models comes before the data home.
  fs::create_directories(root / "prefix" / "share" / "rill" / "models");
  fs::create_symlink(kDefaultModel, root / "prefix" / "share" / "rill" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf");
  Outcome prefix = run_in(root, rill);
  EXPECT_EQ(prefix.exit_code, 0) << prefix.out;
  EXPECT_NE(prefix.out.find("prefix/share/rill/models"), std::string::npos) << prefix.out;
  fs::remove_all(root);
}

TEST(Cli, AnEmptyApiKeyRefusesToStart) {
  // An empty key would serve without authentication, silently. (`timeout`:
  // a server that starts anyway must not hang the test.)
  const std::string serve = "timeout 60 " + kRill + " serve " + kDefaultModel + " --port 0";
  Outcome flag = run_in(std::filesystem::temp_directory_path(), "env -u RILL_API_KEY " + serve + " --api-key ''");
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.out.find("--api-key: the key is empty"), std::string::npos) << flag.out;
  Outcome env = run_in(std::filesystem::temp_directory_path(), "RILL_API_KEY= " + serve);
  EXPECT_EQ(env.exit_code, 2);
  EXPECT_NE(env.out.find("$RILL_API_KEY is set but empty"), std::string::npos) << env.out;
}

TEST(Cli, BadArgumentsAreRejected) {
  Outcome r = run_rill("score " + kLlamaGolden + " --ids 1,x,3 --json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'x'"), std::string::npos) << r.err;
  Outcome both = run_rill("run --prompt hi --prompt-ids 1");
  EXPECT_EQ(both.exit_code, 2);
  Outcome unknown = run_rill("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  Outcome help = run_rill("run --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--prompt-ids"), std::string::npos);
}

TEST(Cli, PromptLongerThanTheContextIsRejectedBeforeWork) {
  if (!std::filesystem::exists(kLlamaGolden)) GTEST_SKIP();
  Outcome r = run_rill("run " + kLlamaGolden + " --prompt-ids 1,2,3 --max-tokens 100 --ctx-size 16 --json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("exceeds the context"), std::string::npos) << r.err;
}

// rill bench --json reports the engine's step counts: every step, and of
// those the ones queued while the step before them ran (pipelined decode;
// the CPU computes a step within the call, so none there, serial or not).
TEST(Cli, BenchJsonReportsItsSteps) {
  if (!std::filesystem::exists(kLlamaGolden)) GTEST_SKIP();
  for (const std::string extra : {"", " --serial-steps"}) {
    SCOPED_TRACE(extra);
    Outcome r = run_rill("bench " + kLlamaGolden +
                         " --json --concurrency 2 --requests 3 --prompt-tokens 8 --gen-tokens 6 --threads 2" + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("generated_tokens").get<int>(), 18);
    // At least the prefill and five more decode steps for the last request.
    EXPECT_GE(j.at("steps").get<int>(), 6);
    ASSERT_TRUE(j.contains("steps_pipelined")) << r.out;
    EXPECT_EQ(j.at("steps_pipelined").get<int>(), 0);
  }
}

}  // namespace
