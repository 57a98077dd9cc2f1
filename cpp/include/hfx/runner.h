// Running the parts of an artifact folder, and the greedy generation loop over them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hfx/manifest.h"
#include "hfx/tensor.h"

namespace hfx {

/// One loaded part: `run(inputs)` takes the part's inputs in manifest order and returns its outputs in
/// manifest order (model outputs only: ExecuTorch's mutated-input outputs are dropped).
class PartRunner {
 public:
  virtual ~PartRunner() = default;
  virtual std::vector<Tensor> run(const std::vector<Tensor>& inputs) = 0;
  /// The largest shape each tensor input accepts, in the order run() takes them: a dynamic axis at the
  /// bound the program was exported with (ExecuTorch plans memory for it; `hf-exporters export
  /// --max-seq-len`). Empty when the runtime does not say (AOTInductor).
  virtual std::vector<std::vector<int64_t>> input_bounds() const { return {}; }
};

/// Load `part` with its runtime: ExecuTorch for a .pte, libtorch's AOTInductor package loader for an
/// AOTInductor package. Throws hfx::Error for another format (an ExportedProgram, ONNX) or a file
/// the runtime refuses.
std::unique_ptr<PartRunner> load_part(const Manifest& manifest, const Part& part);

/// Load an AOTInductor package (`*.aoti.pt2`, written by `hf-exporters export --aoti`). Throws
/// hfx::Error when the file is not a package the loader accepts.
std::unique_ptr<PartRunner> load_aoti(const std::filesystem::path& path);

/// Load `method` of a .pte file with the ExecuTorch runtime (a generation folder's parts are the methods
/// of one program). Throws hfx::Error when the file is not a valid program or has no such method, or the
/// method cannot be loaded; its run() throws hfx::Error, before executing, for an input with another rank
/// or an axis past input_bounds().
std::unique_ptr<PartRunner> load_executorch(const std::filesystem::path& path, const std::string& method = "forward");

/// The folder's single forward part (a single export, or the folder's `part` when given) run on
/// `named` inputs (by manifest input name). Throws hfx::Error for a missing input or a runtime error.
std::map<std::string, Tensor> run_forward(const Manifest& manifest, const std::map<std::string, Tensor>& named,
                                          const std::string& part = "");

/// Wall time in seconds of each of `repeat` forwards of the part (loaded once, one untimed warm-up run).
std::vector<double> time_forward(const Manifest& manifest, const std::map<std::string, Tensor>& named, const std::string& part, int repeat);

struct GenerationResult {
  std::vector<int64_t> ids;  // prompt then new tokens (batch 1)
  int new_tokens = 0;
  double seconds = 0.0;      // wall time of the loop (prefill and decode steps)
  double prefill_seconds = 0.0;  // wall time of the prompt's forward (the first new token's logits)
};

/// Greedy generation over a decoder-only generation folder's prefill and decode parts, loaded once
/// (see generate_greedy for what is supported). Throws hfx::Error as generate_greedy does.
class Generator {
 public:
  explicit Generator(const Manifest& manifest);
  GenerationResult generate(const std::vector<int64_t>& prompt, int max_new_tokens, int64_t eos_token_id = -1);

 private:
  /// A folder whose one part holds its key/value cache (cache kind "program"): the prompt runs at positions
  /// 0..T-1, each new token at the next position, with no cache tensor in or out.
  GenerationResult generate_in_program(const std::vector<int64_t>& prompt, int max_new_tokens, int64_t eos_token_id);
  bool in_program_ = false;
  int64_t program_limit_ = -1;  // the positions the program's cache holds (max_cache_len)
  const Part* prefill_ = nullptr;
  std::unique_ptr<PartRunner> prefill_runner_, decode_runner_;
  int64_t prefill_limit_ = -1;  // the longest prompt the prefill part takes (-1: the runtime does not say)
  int64_t decode_limit_ = -1;   // the most positions (prompt and new tokens) the decode part's mask takes
  int64_t vocab_size_ = -1;     // token ids are in [0, vocab_size_) (-1: the manifest does not say)
  std::vector<int64_t> eos_token_ids_;  // the folder's end-of-sequence ids, used when no eos_token_id is given
  /// Whether `token` ends the generation: it is `eos_token_id` when one is given (>= 0), else one of the folder's.
  bool ends(int64_t token, int64_t eos_token_id) const;
};

/// Greedy generation from a decoder-only generation folder (prefill and decode parts over a dynamic
/// cache, or one part holding its cache in the program): `prompt` token ids, up to `max_new_tokens` new ones (stops early at
/// `eos_token_id` when it is >= 0, else at one of the folder's generation_config.json eos_token_id, as transformers' generate does).
/// Throws hfx::Error for a folder of another kind (encoder-decoder, static cache), an empty prompt, or,
/// before running anything, a prompt (or prompt and new tokens) longer than the parts were exported for,
/// or a token id outside the vocabulary (a quantized embedding kernel would abort the process on it).
GenerationResult generate_greedy(const Manifest& manifest, const std::vector<int64_t>& prompt, int max_new_tokens,
                                 int64_t eos_token_id = -1);

}  // namespace hfx
