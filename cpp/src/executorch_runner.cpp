// ExecuTorch parts: the .pte program run with the ExecuTorch C++ runtime (Program / Method API).
// The wheel ships the runtime headers but not extension/module, so the loader, the allocators and
// the input/output plumbing that Module would provide are written here against the runtime API.
#include <executorch/runtime/core/data_loader.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/core/portable_type/tensor_impl.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>

#include "hfx/error.h"
#include "hfx/runner.h"

namespace hfx {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;

namespace {

/// The file mapped read-only into memory (MAP_PRIVATE): segments are views into the mapping, so only the
/// pages the runtime reads are brought in, and the kernel can drop them again (constant weights that a
/// delegate packs into its own buffers are read once). The file must not be truncated while it runs.
class MmapLoader final : public et::DataLoader {
 public:
  explicit MmapLoader(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path + ": cannot open the .pte file (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int saved = errno;
      ::close(fd);
      throw Error(path + ": cannot read the .pte file's size (" + std::strerror(saved) + ")");
    }
    if (st.st_size <= 0) {
      ::close(fd);
      throw Error(path + ": not a valid ExecuTorch program (an empty file)");
    }
    size_ = static_cast<size_t>(st.st_size);
    void* base = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int saved = errno;
    ::close(fd);  // the mapping keeps the file
    if (base == MAP_FAILED) throw Error(path + ": cannot map the .pte file (" + std::strerror(saved) + ")");
    base_ = static_cast<const uint8_t*>(base);
  }
  ~MmapLoader() override { ::munmap(const_cast<uint8_t*>(base_), size_); }
  MmapLoader(const MmapLoader&) = delete;
  MmapLoader& operator=(const MmapLoader&) = delete;
  et::Result<et::FreeableBuffer> load(size_t offset, size_t size, const SegmentInfo&) const override {
    if (offset > size_ || size > size_ - offset) return et::Error::InvalidArgument;
    return et::FreeableBuffer(base_ + offset, size, nullptr);
  }
  et::Result<size_t> size() const override { return size_; }

 private:
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

/// Bytes of physical memory (0 when unknown). A corrupt program can ask for any size; one larger than
/// this is refused instead of attempted (which would throw bad_alloc, or fill memory until killed).
size_t physical_memory() {
  static const size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{0};
  }();
  return bytes;
}

bool larger_than_memory(size_t size) { return physical_memory() != 0 && size > physical_memory(); }

/// A MemoryAllocator that takes every block from the heap (freed on reset and destruction).
class HeapAllocator final : public et::MemoryAllocator {
 public:
  HeapAllocator() : et::MemoryAllocator(0, nullptr) {}
  ~HeapAllocator() override { reset(); }
  void* allocate(size_t size, size_t alignment = kDefaultAlignment) override {
    if (alignment < alignof(std::max_align_t)) alignment = alignof(std::max_align_t);
    if (larger_than_memory(size) || (alignment & (alignment - 1)) != 0) return nullptr;  // the runtime reports MemoryAllocationFailed
    const size_t rounded = (size + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
    if (p) blocks_.push_back(p);
    return p;
  }
  void reset() override {
    for (void* p : blocks_) std::free(p);
    blocks_.clear();
  }

 private:
  std::vector<void*> blocks_;
};

ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "float32") return ScalarType::Float;
  if (dtype == "float64") return ScalarType::Double;
  if (dtype == "float16") return ScalarType::Half;
  if (dtype == "bfloat16") return ScalarType::BFloat16;
  if (dtype == "int64") return ScalarType::Long;
  if (dtype == "int32") return ScalarType::Int;
  if (dtype == "int16") return ScalarType::Short;
  if (dtype == "int8") return ScalarType::Char;
  if (dtype == "uint8") return ScalarType::Byte;
  if (dtype == "bool") return ScalarType::Bool;
  throw Error("dtype '" + dtype + "' has no ExecuTorch scalar type here");
}

std::string dtype_name(ScalarType type) {
  switch (type) {
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Long: return "int64";
    case ScalarType::Int: return "int32";
    case ScalarType::Short: return "int16";
    case ScalarType::Char: return "int8";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Bool: return "bool";
    default: throw Error("an output has an ExecuTorch scalar type hfx does not read (" + std::to_string(static_cast<int>(type)) + ")");
  }
}

std::string error_text(et::Error error) {
  std::string name = et::to_string(error);  // "Error::InvalidProgram"
  if (name.rfind("Error::", 0) == 0) name = name.substr(7);
  return "ExecuTorch error " + std::to_string(static_cast<int>(error)) + ": " + name;
}

//: the name of the constant method `prefix` records for `method`: `prefix` itself for `forward`, "<prefix>.<method>"
//: for another method of a multi-method program
std::string constant_method(const char* prefix, const std::string& method) {
  return method == "forward" ? std::string(prefix) : std::string(prefix) + "." + method;
}

//: the constant method in which hf_exporters records how many mutated-input outputs precede the model's
//: (for `forward`; another method `m` of a multi-method program has its own, "<this>.m")
constexpr const char* kInputMutationsMethod = "hf_exporters_input_mutation_outputs";

//: the constant method holding [position, size, kind, ...] for the inputs that index a tensor
//: (hf_exporters.exporters.executorch.input_index_bounds; "<this>.m" for another method m); kind 0: the rows
//: of an embedding table, 1: the positions of an axis (a cache held in the program, written at the index)
constexpr const char* kIndexBoundsMethod = "hf_exporters_input_index_bounds";

//: the constant method holding [position_a, axis_a, position_b, axis_b, ...] for the input axes the trace tied to
//: one size (hf_exporters.exporters.executorch.input_equal_axes; "<this>.m" for another method m)
constexpr const char* kEqualAxesMethod = "hf_exporters_input_equal_axes";

//: the constant method holding [position, axis, size, ...] for the input axes a dynamic program was traced at one
//: size on (hf_exporters.exporters.executorch.input_static_axes; "<this>.m" for another method m)
constexpr const char* kStaticAxesMethod = "hf_exporters_input_static_axes";

class ExecutorchPart final : public PartRunner {
 public:
  ExecutorchPart(const std::filesystem::path& path, const std::string& method) : path_(path.string()), method_name_(method) {
    static std::once_flag init;
    std::call_once(init, [] { et::runtime_init(); });
    loader_.emplace(path_);
    auto program = et::Program::load(&*loader_, et::Program::Verification::InternalConsistency);
    if (!program.ok()) throw Error(path_ + ": not a valid ExecuTorch program (" + error_text(program.error()) + ")");
    program_.emplace(std::move(*program));
    method_ = load(method_name_.c_str(), planned_);
    // The shape each tensor input is planned for: a dynamic axis at its upper bound.
    auto meta = program_->method_meta(method_name_.c_str());
    for (size_t i = 0; i < meta->num_inputs(); ++i) {
      auto tag = meta->input_tag(i);
      if (!tag.ok() || *tag != et::Tag::Tensor) continue;
      auto info = meta->input_tensor_meta(i);
      if (!info.ok()) throw Error(path_ + ": input " + std::to_string(i) + " has no tensor metadata (" + error_text(info.error()) + ")");
      bounds_.emplace_back(info->sizes().begin(), info->sizes().end());
    }
    const std::string constant_name = constant_method(kInputMutationsMethod, method_name_);
    if (has_method(constant_name)) {
      std::vector<std::vector<uint8_t>> scratch;
      auto constant = load(constant_name.c_str(), scratch);
      if (constant->execute() == et::Error::Ok && constant->outputs_size() > 0 && constant->get_output(0).isInt())
        skip_outputs_ = static_cast<size_t>(constant->get_output(0).toInt());
    }
    const std::string bounds_name = constant_method(kIndexBoundsMethod, method_name_);
    for (const auto& v : constant_ints(bounds_name, 3, "(position, size, kind) triples")) {
      if (v[1] < 1) throw Error(path_ + ": the constant method '" + bounds_name + "' does not hold (position, size, kind) triples");
      index_rows_[static_cast<size_t>(v[0])] = {v[1], v[2]};
    }
    for (const auto& v : constant_ints(constant_method(kEqualAxesMethod, method_name_), 4, "(position, axis, position, axis) quadruples"))
      equal_axes_.push_back({v[0], v[1], v[2], v[3]});
    for (const auto& v : constant_ints(constant_method(kStaticAxesMethod, method_name_), 3, "(position, axis, size) triples"))
      static_axes_.push_back({v[0], v[1], v[2]});
  }

  std::vector<std::vector<int64_t>> input_bounds() const override { return bounds_; }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) override {
    auto meta = program_->method_meta(method_name_.c_str());
    size_t next = 0;
    std::vector<std::vector<et::etensor::TensorImpl::SizesType>> sizes(meta->num_inputs());
    for (size_t i = 0; i < meta->num_inputs(); ++i) {
      auto tag = meta->input_tag(i);
      if (!tag.ok() || *tag != et::Tag::Tensor) continue;  // a constant scalar input keeps its value
      if (next >= inputs.size())
        throw Error(path_ + ": the program takes more tensor inputs than the " + std::to_string(inputs.size()) + " given");
      const Tensor& t = inputs[next++];
      if (static_cast<int64_t>(t.data.size()) != t.numel() * static_cast<int64_t>(element_size(t.dtype)))
        throw Error(path_ + ": input " + std::to_string(next - 1) + " holds the wrong number of bytes for its shape");
      check_bounds(next - 1, t);
      check_indices(i, t);
      const auto dim = t.shape.size();
      sizes[i].assign(t.shape.begin(), t.shape.end());
      std::vector<et::etensor::TensorImpl::DimOrderType> order(dim);
      std::vector<et::etensor::TensorImpl::StridesType> strides(dim);
      for (size_t d = 0; d < dim; ++d) order[d] = static_cast<uint8_t>(d);
      for (int64_t d = static_cast<int64_t>(dim) - 1, s = 1; d >= 0; --d) {
        strides[d] = static_cast<int32_t>(s);
        s *= t.shape[d];
      }
      et::etensor::TensorImpl impl(scalar_type(t.dtype), static_cast<ssize_t>(dim), sizes[i].data(),
                                   const_cast<uint8_t*>(t.data.data()), order.data(), strides.data(),
                                   et::TensorShapeDynamism::DYNAMIC_BOUND);
      et::etensor::Tensor tensor(&impl);
      const et::Error status = method_->set_input(et::EValue(tensor), i);
      if (status != et::Error::Ok)
        throw Error(path_ + ": input " + std::to_string(i) + " refused (" + error_text(status) +
                    "; a shape past the bounds the program was exported with?)");
    }
    if (next != inputs.size())
      throw Error(path_ + ": the program takes " + std::to_string(next) + " tensor inputs, " + std::to_string(inputs.size()) + " given");
    check_static_axes(sizes);
    check_equal_axes(sizes);
    const et::Error status = method_->execute();
    if (status != et::Error::Ok) throw Error(path_ + ": execute failed (" + error_text(status) + ")");
    std::vector<Tensor> outputs;
    for (size_t i = skip_outputs_; i < method_->outputs_size(); ++i) {
      const et::EValue& value = method_->get_output(i);
      if (!value.isTensor()) continue;
      const auto& out = value.toTensor();
      Tensor t;
      t.dtype = dtype_name(out.scalar_type());
      t.shape.assign(out.sizes().begin(), out.sizes().end());
      const auto* bytes = static_cast<const uint8_t*>(out.const_data_ptr());
      t.data.assign(bytes, bytes + out.nbytes());  // copied: planned memory is reused by the next run
      outputs.push_back(std::move(t));
    }
    return outputs;
  }

 private:
  /// Refuse, before set_input, a tensor input whose rank differs or an axis past its planned bound: the
  /// runtime only checks the element count against the planned capacity, so a longer sequence in a
  /// smaller batch would be accepted and fail later inside execute() with no reason given.
  void check_bounds(size_t index, const Tensor& t) const {
    if (index >= bounds_.size()) return;
    const auto& bound = bounds_[index];
    if (t.shape.size() != bound.size())
      throw Error(path_ + ": input " + std::to_string(index) + " has " + std::to_string(t.shape.size()) + " axes, the program takes " +
                  std::to_string(bound.size()));
    for (size_t d = 0; d < bound.size(); ++d)
      if (t.shape[d] > bound[d])
        throw Error(path_ + ": input " + std::to_string(index) + " axis " + std::to_string(d) + " is " + std::to_string(t.shape[d]) +
                    ", the program was exported for at most " + std::to_string(bound[d]) +
                    " (ExecuTorch plans memory for a dynamic axis up to its export bound: hf-exporters export --max-seq-len raises it)");
  }

  /// Whether the program holds a method `name`, asked without the runtime logging an error for an absent one (as
  /// method_meta does): a program exported before a constant method existed, or with nothing to record, lacks it.
  bool has_method(const std::string& name) const {
    for (size_t i = 0; i < program_->num_methods(); ++i) {
      auto each = program_->get_method_name(i);
      if (each.ok() && name == *each) return true;
    }
    return false;
  }

  /// The values of the constant method `name` in groups of `group` non-negative integers; none when the program
  /// has no such method (one exported before it existed, or with nothing to record).
  std::vector<std::vector<int64_t>> constant_ints(const std::string& name, size_t group, const char* what) {
    std::vector<std::vector<int64_t>> groups;
    if (!has_method(name)) return groups;
    std::vector<std::vector<uint8_t>> scratch;
    auto constant = load(name.c_str(), scratch);
    if (constant->execute() != et::Error::Ok) throw Error(path_ + ": cannot read the constant method '" + name + "'");
    for (size_t i = 0; i + group <= constant->outputs_size(); i += group) {
      std::vector<int64_t> values;
      for (size_t k = 0; k < group; ++k) {
        const et::EValue& value = constant->get_output(i + k);
        if (!value.isInt() || value.toInt() < 0) throw Error(path_ + ": the constant method '" + name + "' does not hold " + what);
        values.push_back(value.toInt());
      }
      groups.push_back(std::move(values));
    }
    return groups;
  }

  /// Refuse, before execute, an input whose size on an axis the dynamic program was traced at one size on
  /// differs from it: the runtime accepts any shape within the planned bounds, and kernels that assume the
  /// traced size abort the process on another (llama::update_cache on a batch of 2).
  template <typename Sizes>
  void check_static_axes(const Sizes& sizes) const {
    for (const auto& [position, axis, size] : static_axes_) {
      if (static_cast<size_t>(position) >= sizes.size() || static_cast<size_t>(axis) >= sizes[position].size()) continue;
      if (sizes[position][axis] != size)
        throw Error(path_ + ": input " + std::to_string(position) + " is " + std::to_string(sizes[position][axis]) + " long on axis " +
                    std::to_string(axis) + ", which the program was exported for at " + std::to_string(size) + " only");
    }
  }

  /// Refuse, before execute, inputs whose axes the trace tied to one size but that differ: kernels assume
  /// they agree, and some abort the process on a mismatch (llama::custom_sdpa).
  template <typename Sizes>
  void check_equal_axes(const Sizes& sizes) const {
    for (const auto& [a, axis_a, b, axis_b] : equal_axes_) {
      if (static_cast<size_t>(a) >= sizes.size() || static_cast<size_t>(b) >= sizes.size()) continue;
      const auto &first = sizes[a], &second = sizes[b];
      if (static_cast<size_t>(axis_a) >= first.size() || static_cast<size_t>(axis_b) >= second.size()) continue;
      if (first[axis_a] != second[axis_b])
        throw Error(path_ + ": inputs " + std::to_string(a) + " (axis " + std::to_string(axis_a) + ") and " + std::to_string(b) + " (axis " +
                    std::to_string(axis_b) + ") are " + std::to_string(first[axis_a]) + " and " + std::to_string(second[axis_b]) +
                    " long: the program was exported with one size for both");
    }
  }

  /// Refuse an input that indexes a tensor when it holds an index outside it: ExecuTorch's quantized
  /// embedding kernels abort the process on one (ET_CHECK), and index_put checks only part of an index.
  void check_indices(size_t position, const Tensor& t) const {
    auto found = index_rows_.find(position);
    if (found == index_rows_.end() || t.numel() == 0) return;
    const int64_t rows = found->second.first, kind = found->second.second;
    const char* what = kind == 0 ? " rows of the embedding table" : kind == 1 ? " positions of the axis" : " positions of the cache";
    int64_t bad = 0, apart = -1;  // apart: the first element not one past the one before it
    bool out = false;
    auto scan = [&](auto sample) {
      using T = decltype(sample);
      const auto* values = reinterpret_cast<const T*>(t.data.data());
      for (int64_t k = 0; k < t.numel() && !out; ++k) {
        if (values[k] < 0 || static_cast<int64_t>(values[k]) >= rows) out = true, bad = static_cast<int64_t>(values[k]);
        if (apart < 0 && k > 0 && static_cast<int64_t>(values[k]) != static_cast<int64_t>(values[k - 1]) + 1) apart = k;
      }
    };
    int64_t start = 0;
    if (t.dtype == "int64") scan(int64_t{}), start = *reinterpret_cast<const int64_t*>(t.data.data());
    else if (t.dtype == "int32") scan(int32_t{}), start = *reinterpret_cast<const int32_t*>(t.data.data());
    else return;
    // kind 2: the run of one position per element written from the first value must fit in the cache too
    if (!out && kind == 2 && start + t.numel() > rows)
      throw Error(path_ + ": input " + std::to_string(position) + " starts at position " + std::to_string(start) + ": its " +
                  std::to_string(t.numel()) + " positions from there pass the " + std::to_string(rows) +
                  " positions of the cache it writes (valid starts for " + std::to_string(t.numel()) + ": 0 to " +
                  std::to_string(rows - t.numel()) + ")");
    if (out)
      throw Error(path_ + ": input " + std::to_string(position) + " holds the index " + std::to_string(bad) + ", outside the " + std::to_string(rows) +
                  what + " it indexes (valid: 0 to " + std::to_string(rows - 1) + ")");
    // kind 2: the operators write and attend one run of positions from the first value, whatever the others hold
    if (kind == 2 && apart > 0) {
      auto at = [&](int64_t k) {
        return t.dtype == "int64" ? reinterpret_cast<const int64_t*>(t.data.data())[k] : int64_t{reinterpret_cast<const int32_t*>(t.data.data())[k]};
      };
      throw Error(path_ + ": input " + std::to_string(position) + " holds the positions " + std::to_string(at(apart - 1)) + " then " +
                  std::to_string(at(apart)) + " (elements " + std::to_string(apart - 1) + " and " + std::to_string(apart) +
                  "): the cache is written at one run of positions, each one past the one before");
    }
  }

  std::unique_ptr<et::Method> load(const char* name, std::vector<std::vector<uint8_t>>& planned) {
    auto meta = program_->method_meta(name);
    if (!meta.ok()) throw Error(path_ + ": the program has no method '" + std::string(name) + "'");
    planned.clear();
    spans_.emplace_back();
    auto& spans = spans_.back();
    size_t total = 0;
    for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
      auto size = meta->memory_planned_buffer_size(i);
      if (!size.ok() || *size < 0) throw Error(path_ + ": method '" + std::string(name) + "' has no valid size for its planned buffer " + std::to_string(i));
      const size_t bytes = static_cast<size_t>(*size);
      total += bytes;
      if (total < bytes || larger_than_memory(total))
        throw Error(path_ + ": method '" + std::string(name) + "' asks for " + (total < bytes ? std::string("more than 2^64") : std::to_string(total)) +
                    " bytes of planned memory, more than this machine's " + std::to_string(physical_memory()) + " bytes (a corrupt program?)");
      try {
        planned.emplace_back(bytes);
      } catch (const std::bad_alloc&) {
        throw Error(path_ + ": cannot allocate the " + std::to_string(bytes) + " bytes of planned memory of method '" + std::string(name) + "'");
      }
      spans.emplace_back(planned.back().data(), planned.back().size());
    }
    planned_allocators_.push_back(std::make_unique<et::HierarchicalAllocator>(et::Span<et::Span<uint8_t>>(spans.data(), spans.size())));
    managers_.push_back(std::make_unique<et::MemoryManager>(&method_allocator_, planned_allocators_.back().get(), &temp_allocator_));
    auto method = program_->load_method(name, managers_.back().get());
    if (!method.ok()) throw Error(path_ + ": cannot load method '" + std::string(name) + "' (" + error_text(method.error()) + ")");
    return std::make_unique<et::Method>(std::move(*method));
  }

  std::string path_;
  std::string method_name_;
  std::optional<MmapLoader> loader_;
  std::optional<et::Program> program_;
  HeapAllocator method_allocator_, temp_allocator_;
  std::vector<std::vector<uint8_t>> planned_;
  std::vector<std::vector<et::Span<uint8_t>>> spans_;
  std::vector<std::unique_ptr<et::HierarchicalAllocator>> planned_allocators_;
  std::vector<std::unique_ptr<et::MemoryManager>> managers_;
  std::unique_ptr<et::Method> method_;
  std::vector<std::vector<int64_t>> bounds_;  // per tensor input, in run()'s order
  size_t skip_outputs_ = 0;
  std::map<size_t, std::pair<int64_t, int64_t>> index_rows_;  // method input position -> (size it indexes, kind)
  std::vector<std::array<int64_t, 4>> equal_axes_;  // (position, axis, position, axis) traced as one size
  std::vector<std::array<int64_t, 3>> static_axes_;  // (position, axis, size) a dynamic program was traced at
};

}  // namespace

std::unique_ptr<PartRunner> load_executorch(const std::filesystem::path& path, const std::string& method) {
  return std::make_unique<ExecutorchPart>(path, method);
}

}  // namespace hfx
