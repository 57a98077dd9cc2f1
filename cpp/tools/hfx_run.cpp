// hfx-run: run an artifact folder written by hf-exporters from C++.
//
//   hfx-run DIR --inputs in.safetensors [--part NAME] [--expect out.safetensors [--atol A]] [--output out.safetensors]
//           [--repeat N]   (N more timed forwards after the first: prints their mean, median, min and max in ms)
//   hfx-run DIR --generate --input-ids 1,2,3 [--max-new-tokens N] [--eos-token-id ID] [--warmup]
//           (prints the ids, the loop's tokens/s, and on their own the prompt's forward in ms and the decode
//           steps' tokens/s; --warmup: one untimed 2-token generation first, so the runtime's first-run work,
//           such as XNNPACK packing its weights, is not counted)
//
// Exit status: 0 done (and, with --expect, every output compared and within --atol), 1 an error or a
// usage error such as a bad flag value (one "error: ..." line on stderr), 2 a parity failure: an
// output differs from --expect beyond --atol, or an output is missing from the --expect file (one
// "error: ..." line naming it), or nothing was compared. The ExecuTorch runtime's own log lines (CPU
// probing, ...) are silenced unless HFX_VERBOSE=1, so stderr holds hfx-run's messages alone.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ext/stdio_filebuf.h>
#include <iostream>
#include <sstream>
#include <string>
#include <chrono>
#include <vector>

#include "hfx/error.h"
#include "hfx/manifest.h"
#include "hfx/runner.h"
#include "hfx/safetensors.h"

namespace {

const char* kUsage =
    "usage: hfx-run DIR --inputs in.safetensors [--part NAME] [--expect out.safetensors [--atol A]] [--output out.safetensors] [--repeat N]\n"
    "       hfx-run DIR --generate --input-ids 1,2,3 [--max-new-tokens N] [--eos-token-id ID] [--warmup]\n"
    "--repeat N: N more timed forwards after the first; prints their mean, median, min and max in ms\n"
    "--generate: prints the ids, tokens/s, the prompt's forward in ms and the decode steps' tokens/s\n"
    "--atol A: a finite number >= 0 (default 1e-3)\n"
    "--eos-token-id ID: stop at ID (default: the folder's generation_config.json eos_token_id)\n"
    "exit status: 0 done (with --expect: every output compared and within --atol); 1 an error or a bad flag;\n"
    "  2 a parity failure: an output beyond --atol, an output missing from the --expect file, or nothing compared\n";

/// A --expect comparison that fails: hfx-run prints "error: ..." and exits with 2.
class ParityFailure : public hfx::Error {
 public:
  using hfx::Error::Error;
};

std::string joined(const std::vector<std::string>& names) {
  std::string all;
  for (const auto& name : names) all += (all.empty() ? "" : ", ") + name;
  return all;
}

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      size_t used = 0;
      ids.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw hfx::Error("--input-ids: '" + item + "' is not an integer");
    }
  }
  return ids;
}

/// A tolerance: a finite number >= 0 (nan, inf and negative values would pass or fail every comparison).
double parse_tolerance(const std::string& option, const std::string& text) {
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
  } catch (const std::exception&) {
    throw hfx::Error(option + ": '" + text + "' is not a number");
  }
  if (!std::isfinite(value) || value < 0) throw hfx::Error(option + ": '" + text + "' is not a tolerance (give a finite number >= 0)");
  return value;
}

/// An integer in [lowest, highest] (checked, not cast from a double: "nan" or "1e30" would be undefined).
int64_t parse_integer(const std::string& option, const std::string& text, int64_t lowest, int64_t highest) {
  int64_t value = 0;
  try {
    size_t used = 0;
    value = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
  } catch (const std::exception&) {
    throw hfx::Error(option + ": '" + text + "' is not an integer");
  }
  if (value < lowest || value > highest)
    throw hfx::Error(option + ": " + text + " is out of range (" + std::to_string(lowest) + " to " + std::to_string(highest) + ")");
  return value;
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::cout << kUsage;
    return args.empty() ? 1 : 0;
  }
  std::string directory, inputs, part, expect, output, input_ids;
  double atol = 1e-3;
  int max_new_tokens = 20;
  int repeat = 0;
  int64_t eos = -1;
  bool generate = false;
  bool warmup = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw hfx::Error(a + " needs a value");
      return args[++i];
    };
    if (a == "--inputs") inputs = value();
    else if (a == "--part") part = value();
    else if (a == "--expect") expect = value();
    else if (a == "--output") output = value();
    else if (a == "--atol") atol = parse_tolerance(a, value());
    else if (a == "--generate") generate = true;
    else if (a == "--warmup") warmup = true;
    else if (a == "--input-ids") input_ids = value();
    else if (a == "--max-new-tokens") max_new_tokens = static_cast<int>(parse_integer(a, value(), 1, INT_MAX));
    else if (a == "--repeat") repeat = static_cast<int>(parse_integer(a, value(), 0, INT_MAX));
    else if (a == "--eos-token-id") eos = parse_integer(a, value(), -1, INT64_MAX);
    else if (!a.empty() && a[0] == '-') throw hfx::Error("unknown option " + a + "\n" + kUsage);
    else if (directory.empty()) directory = a;
    else throw hfx::Error("unexpected argument " + a);
  }
  if (directory.empty()) throw hfx::Error(std::string("no folder given\n") + kUsage);
  const hfx::Manifest manifest = hfx::read_manifest(directory);

  if (generate) {
    if (input_ids.empty()) throw hfx::Error("--generate needs --input-ids");
    const auto prompt = parse_ids(input_ids);
    hfx::Generator generator(manifest);
    if (warmup) generator.generate(prompt, 2, eos);
    const auto result = generator.generate(prompt, max_new_tokens, eos);
    std::string ids;
    for (size_t i = 0; i < result.ids.size(); ++i) ids += (i ? "," : "") + std::to_string(result.ids[i]);
    std::cout << "ids: " << ids << "\n";
    std::printf("%d new tokens in %.3f s: %.1f tokens/s (%s%s)\n", result.new_tokens, result.seconds,
                result.new_tokens / (result.seconds > 0 ? result.seconds : 1e-9), manifest.backend.c_str(),
                warmup ? ", after a warm-up run" : "");
    // the prompt's forward, and the decode steps after it: one token each
    const double decode = result.seconds - result.prefill_seconds;
    std::printf("prefill: %.3f ms for %zu tokens; decode: %d steps, %.1f tokens/s\n", result.prefill_seconds * 1e3, prompt.size(),
                result.new_tokens - 1, result.new_tokens > 1 ? (result.new_tokens - 1) / (decode > 0 ? decode : 1e-9) : 0.0);
    return 0;
  }
  if (inputs.empty()) throw hfx::Error(std::string("give --inputs in.safetensors, or --generate\n") + kUsage);
  const auto named = hfx::read_safetensors(inputs);
  const auto outputs = hfx::run_forward(manifest, named, part);
  if (repeat > 0) {
    auto timing = hfx::time_forward(manifest, named, part, repeat);
    double total = 0.0;
    for (const double s : timing) total += s;
    std::sort(timing.begin(), timing.end());
    const double median = timing.size() % 2 ? timing[timing.size() / 2] : (timing[timing.size() / 2 - 1] + timing[timing.size() / 2]) / 2;
    std::printf("latency: %.3f ms (mean of %d runs after a warm-up run); median %.3f ms, min %.3f ms, max %.3f ms\n", total / repeat * 1e3,
                repeat, median * 1e3, timing.front() * 1e3, timing.back() * 1e3);
  }
  if (!output.empty()) hfx::write_safetensors(output, outputs);
  int status = 0;
  if (!expect.empty()) {
    const auto expected = hfx::read_safetensors(expect);
    std::vector<std::string> missing, names;
    for (const auto& [name, tensor] : outputs) {
      names.push_back(name);
      auto it = expected.find(name);
      if (it == expected.end()) {
        std::printf("%s: not in %s\n", name.c_str(), expect.c_str());
        missing.push_back(name);
        continue;
      }
      const double diff = hfx::max_abs_diff(tensor, it->second);
      const bool ok = diff <= atol;
      std::printf("%s: max abs diff %.3g %s\n", name.c_str(), diff, ok ? "ok" : "FAIL");
      if (!ok) status = 2;
    }
    std::fflush(stdout);
    if (outputs.empty()) throw ParityFailure("nothing compared: the part returned no outputs to compare with " + expect);
    if (missing.size() == outputs.size())
      throw ParityFailure("nothing compared: none of the " + std::to_string(outputs.size()) + " outputs (" + joined(names) + ") is in " + expect);
    if (!missing.empty())
      throw ParityFailure((missing.size() == 1 ? "output " + missing[0] + " is" : "outputs " + joined(missing) + " are") + " not in " + expect +
                          " (" + std::to_string(missing.size()) + " of " + std::to_string(outputs.size()) + " outputs not compared)");
    std::printf("%s (atol %.3g)\n", status == 0 ? "all outputs within tolerance" : "outputs differ beyond tolerance", atol);
  } else {
    for (const auto& [name, tensor] : outputs) {
      std::string shape;
      for (size_t i = 0; i < tensor.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(tensor.shape[i]);
      std::printf("%s: %s [%s]\n", name.c_str(), tensor.dtype.c_str(), shape.c_str());
    }
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // hfx-run's messages go to the original stderr; the runtime's log output (fd 2) goes to /dev/null.
  int messages = STDERR_FILENO;
  const char* verbose = std::getenv("HFX_VERBOSE");
  if (verbose == nullptr || std::string(verbose) != "1") {
    const int saved = dup(STDERR_FILENO);
    const int null = open("/dev/null", O_WRONLY);
    if (saved >= 0 && null >= 0 && dup2(null, STDERR_FILENO) >= 0) messages = saved;
    if (null >= 0) close(null);
  }
  __gnu_cxx::stdio_filebuf<char> buffer(messages, std::ios::out);
  std::ostream err(&buffer);
  try {
    return run(argc, argv);
  } catch (const ParityFailure& e) {
    err << "error: " << e.what() << "\n";
    err.flush();
    return 2;
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    err.flush();
    return 1;
  }
}
