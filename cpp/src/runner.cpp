#include "hfx/runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "hfx/error.h"

namespace hfx {

std::unique_ptr<PartRunner> load_part(const Manifest& manifest, const Part& part) {
  if (part.format == "executorch") return load_executorch(part.file, part.method);
  if (part.format == "aoti") {
#ifdef HFX_WITH_AOTI
    return load_aoti(part.file);
#else
    throw Error(part.file.string() + ": an AOTInductor package, and this hfx was built without libtorch");
#endif
  }
  throw Error(manifest.directory.string() + ": part '" + part.name + "' is " + part.format +
              "; hfx runs ExecuTorch programs (.pte) and AOTInductor packages (export with --aoti)");
}

namespace {

const Part& forward_part(const Manifest& manifest, const std::string& part_name) {
  const Part* part = nullptr;
  if (!part_name.empty()) {
    auto it = manifest.parts.find(part_name);
    if (it == manifest.parts.end()) throw Error(manifest.directory.string() + ": no part named '" + part_name + "'");
    part = &it->second;
  } else if (manifest.parts.size() == 1) {
    part = &manifest.parts.begin()->second;
  } else {
    throw Error(manifest.directory.string() + ": the folder has several parts; name one with --part");
  }
  return *part;
}

std::vector<Tensor> ordered_inputs(const Part* part, const std::map<std::string, Tensor>& named) {
  std::vector<Tensor> inputs;
  for (const auto& spec : part->inputs) {
    auto it = named.find(spec.name);
    if (it == named.end()) throw Error("input '" + spec.name + "' is missing (the part takes them in this order: " + [&] {
      std::string all;
      for (const auto& s : part->inputs) all += (all.empty() ? "" : ", ") + s.name;
      return all;
    }() + ")");
    if (it->second.dtype != spec.dtype)
      throw Error("input '" + spec.name + "' is " + it->second.dtype + ", the part takes " + spec.dtype);
    inputs.push_back(it->second);
  }
  return inputs;
}

}  // namespace

std::vector<double> time_forward(const Manifest& manifest, const std::map<std::string, Tensor>& named, const std::string& part_name, int repeat) {
  const Part& part = forward_part(manifest, part_name);
  const auto inputs = ordered_inputs(&part, named);
  auto runner = load_part(manifest, part);
  runner->run(inputs);
  std::vector<double> seconds;
  for (int i = 0; i < repeat; ++i) {
    const auto started = std::chrono::steady_clock::now();
    runner->run(inputs);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  return seconds;
}

std::map<std::string, Tensor> run_forward(const Manifest& manifest, const std::map<std::string, Tensor>& named, const std::string& part_name) {
  const Part* part = &forward_part(manifest, part_name);
  const auto inputs = ordered_inputs(part, named);
  auto runner = load_part(manifest, *part);
  auto outputs = runner->run(inputs);
  if (outputs.size() != part->outputs.size())
    throw Error(part->file.string() + ": returned " + std::to_string(outputs.size()) + " outputs, the manifest lists " + std::to_string(part->outputs.size()));
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < outputs.size(); ++i) out.emplace(part->outputs[i], std::move(outputs[i]));
  return out;
}

namespace {

/// The float value of IEEE half-precision bits `h`.
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // zero
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

/// The float value of bfloat16 bits `b` (the high half of a float32).
float bfloat16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

/// The argmax over the last row of `logits` (float32, float16 or bfloat16; `[..., vocab]`).
int64_t argmax_last(const Tensor& logits) {
  const bool half = logits.dtype == "float16", bf16 = logits.dtype == "bfloat16";
  if (logits.dtype != "float32" && !half && !bf16)
    throw Error("logits are " + logits.dtype + "; the greedy loop reads float32, float16 or bfloat16");
  const int64_t vocab = logits.shape.back();
  const int64_t rows = logits.numel() / vocab;
  const size_t first = static_cast<size_t>((rows - 1) * vocab);
  auto value = [&](int64_t v) -> float {
    if (!half && !bf16) return reinterpret_cast<const float*>(logits.data.data())[first + v];
    const uint16_t bits = reinterpret_cast<const uint16_t*>(logits.data.data())[first + v];
    return half ? half_to_float(bits) : bfloat16_to_float(bits);
  };
  int64_t best = 0;
  float top = value(0);
  for (int64_t v = 1; v < vocab; ++v) {
    const float x = value(v);
    if (x > top) {
      top = x;
      best = v;
    }
  }
  return best;
}

/// The largest size axis `axis` of the part's input `name` takes (by the runner's input bounds, in
/// manifest order); -1 when the runner does not say or the part has no such input.
int64_t input_bound(const Part& part, const PartRunner& runner, const std::string& name, size_t axis) {
  const auto bounds = runner.input_bounds();
  if (bounds.size() != part.inputs.size()) return -1;
  for (size_t i = 0; i < part.inputs.size(); ++i)
    if (part.inputs[i].name == name) return axis < bounds[i].size() ? bounds[i][axis] : -1;
  return -1;
}

int64_t smaller_known(int64_t a, int64_t b) { return a < 0 ? b : b < 0 ? a : std::min(a, b); }

/// "prompt of N tokens, this folder was exported for at most M (...)": the bound comes from
/// `hf-exporters export --max-seq-len` (default 128, or the example's length when longer).
std::string too_long(const std::string& what, int64_t limit, int64_t positions, const std::string& alternative = "") {
  return what + ", this folder was exported for at most " + std::to_string(limit) + " (re-export with hf-exporters export --max-seq-len " +
         std::to_string(positions) + " or more" + alternative + ")";
}

}  // namespace

Generator::Generator(const Manifest& manifest) {
  if (manifest.kind != "generation") throw Error(manifest.directory.string() + ": not a generation folder (export it with --task text-generation)");
  if (manifest.is_encoder_decoder) throw Error(manifest.directory.string() + ": encoder-decoder generation is not supported by hfx yet (decoder-only folders are)");
  const Part& decode = manifest.part_with_role("decode");
  vocab_size_ = manifest.vocab_size;
  eos_token_ids_ = manifest.eos_token_ids;
  if (decode.cache_kind == "program" && manifest.parts.size() == 1) {
    // the program holds the cache: one method runs the prompt at positions 0..T-1, then each new token
    prefill_ = &decode;
    decode_runner_ = load_part(manifest, decode);
    in_program_ = true;
    program_limit_ = decode.max_cache_len;
    return;
  }
  const Part& prefill = manifest.part_with_role("prefill");
  if (decode.cache_kind != "dynamic" || manifest.parts.size() != 2)
    throw Error(manifest.directory.string() + ": only folders of a prefill and a decode part over a dynamic cache are supported by hfx yet (this one: cache '" + decode.cache_kind + "', " + std::to_string(manifest.parts.size()) + " parts)");
  prefill_ = &prefill;
  prefill_runner_ = load_part(manifest, prefill);
  decode_runner_ = load_part(manifest, decode);
  prefill_limit_ = smaller_known(input_bound(prefill, *prefill_runner_, "input_ids", 1), input_bound(prefill, *prefill_runner_, "attention_mask", 1));
  decode_limit_ = input_bound(decode, *decode_runner_, "attention_mask", 1);  // a mask over every position so far
}

bool Generator::ends(int64_t token, int64_t eos_token_id) const {
  if (eos_token_id >= 0) return token == eos_token_id;
  return std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

GenerationResult Generator::generate(const std::vector<int64_t>& prompt, int max_new_tokens, int64_t eos_token_id) {
  if (prompt.empty()) throw Error("the prompt has no token ids");
  if (max_new_tokens < 1) throw Error("max_new_tokens must be at least 1");
  const int64_t length = static_cast<int64_t>(prompt.size());
  // ExecuTorch's quantized embedding kernel aborts the process on an id past its table: refuse it here
  for (const int64_t id : prompt)
    if (id < 0 || (vocab_size_ >= 0 && id >= vocab_size_))
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary" +
                  (vocab_size_ >= 0 ? " (0 to " + std::to_string(vocab_size_ - 1) + ")" : " (ids are >= 0)"));
  // Checked before running anything: past the bounds, ExecuTorch fails inside execute() with no reason.
  const int64_t positions = length + max_new_tokens - 1;  // the last decode step's mask covers them all
  if (prefill_limit_ >= 0 && length > prefill_limit_)
    throw Error(too_long("prompt of " + std::to_string(length) + " tokens", prefill_limit_, positions));
  if (max_new_tokens > 1 && decode_limit_ >= 0 && positions > decode_limit_)
    throw Error(too_long("prompt of " + std::to_string(length) + " tokens and " + std::to_string(max_new_tokens) + " new tokens need " +
                             std::to_string(positions) + " positions",
                         decode_limit_, positions, ", or ask for at most " + std::to_string(decode_limit_ - length + 1) + " new tokens"));
  if (in_program_) return generate_in_program(prompt, max_new_tokens, eos_token_id);
  GenerationResult result;
  result.ids = prompt;
  const auto started = std::chrono::steady_clock::now();
  std::vector<Tensor> outputs = prefill_runner_->run({make_int64({1, length}, prompt), make_int64({1, length}, std::vector<int64_t>(prompt.size(), 1))});
  result.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (int step = 0; step < max_new_tokens; ++step) {
    if (outputs.size() < 2) throw Error(prefill_->file.string() + ": returned no cache tensors");
    const int64_t token = argmax_last(outputs[0]);
    result.ids.push_back(token);
    ++result.new_tokens;
    if (ends(token, eos_token_id) || step + 1 == max_new_tokens) break;
    std::vector<Tensor> feed;
    feed.push_back(make_int64({1, 1}, {token}));
    feed.push_back(make_int64({1, static_cast<int64_t>(result.ids.size())}, std::vector<int64_t>(result.ids.size(), 1)));
    for (size_t i = 1; i < outputs.size(); ++i) feed.push_back(std::move(outputs[i]));
    outputs = decode_runner_->run(feed);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

namespace {

std::vector<int64_t> positions_from(int64_t start, int64_t count) {
  std::vector<int64_t> positions(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) positions[static_cast<size_t>(i)] = start + i;
  return positions;
}

}  // namespace

GenerationResult Generator::generate_in_program(const std::vector<int64_t>& prompt, int max_new_tokens, int64_t eos_token_id) {
  const int64_t length = static_cast<int64_t>(prompt.size());
  const int64_t positions = length + max_new_tokens - 1;
  if (program_limit_ > 0 && length > program_limit_)
    throw Error(too_long("prompt of " + std::to_string(length) + " tokens", program_limit_, positions));
  if (program_limit_ > 0 && positions > program_limit_)
    throw Error(too_long("prompt of " + std::to_string(length) + " tokens and " + std::to_string(max_new_tokens) + " new tokens need " +
                             std::to_string(positions) + " positions",
                         program_limit_, positions, ", or ask for at most " + std::to_string(program_limit_ - length + 1) + " new tokens"));
  GenerationResult result;
  result.ids = prompt;
  const auto started = std::chrono::steady_clock::now();
  std::vector<Tensor> outputs = decode_runner_->run({make_int64({1, length}, prompt), make_int64({length}, positions_from(0, length))});
  result.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (int step = 0; step < max_new_tokens; ++step) {
    if (outputs.empty()) throw Error(prefill_->file.string() + ": returned no logits");
    const int64_t token = argmax_last(outputs[0]);
    result.ids.push_back(token);
    ++result.new_tokens;
    if (ends(token, eos_token_id) || step + 1 == max_new_tokens) break;
    const int64_t position = static_cast<int64_t>(result.ids.size()) - 1;
    outputs = decode_runner_->run({make_int64({1, 1}, {token}), make_int64({1}, {position})});
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

GenerationResult generate_greedy(const Manifest& manifest, const std::vector<int64_t>& prompt, int max_new_tokens, int64_t eos_token_id) {
  return Generator(manifest).generate(prompt, max_new_tokens, eos_token_id);
}

}  // namespace hfx
