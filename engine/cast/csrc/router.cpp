// Kernel Forge guarded-dispatch router in C++: one boxed kernel per overridden ATen overload.
//
// A call's arguments are compared with each variant's exact signature (dtype, sizes, strides but a size-1
// dim's, data alignment capped at 16 bytes, device index, neg/conj bits; values of non-tensor arguments). A hit
// allocates the outputs, writes the pointers into the kernel parameters and calls cuLaunchKernel on
// the current CUDA stream, without entering Python. A miss calls the kernel that was registered before
// ours (SafeKernelFunction::callBoxed), or where that one was deregistered since, the one below ours then. An
// op that writes an argument is routed here only if no two of its tensor arguments share storage (checked per
// call). Compiled on first use with torch.utils.cpp_extension; see cpp_router.py.
// Only what the router uses, not <torch/extension.h> (all of libtorch's C++ API): at -O0 on a loaded two-core
// machine the build took 90 s with it, 55 s with these.
#include <torch/csrc/utils/pybind.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct ArgDesc {
  int kind = 0;  // 0: must be None, 1: tensor, 2: value (compared), 3: never matches, 4: a Python number
                 // in a Tensor slot (arrives as a wrapped 0-dim CPU tensor; compared by value)
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  int64_t align = 16;
  int64_t device = -1;
  bool neg = false, conj = false;
  int cl = -1;  // a 4-D/5-D tensor with a size-1 dim: whether PyTorch takes it for channels-last (cl_by_strides)
  c10::IValue value;
  double number = 0.0;
  bool integral = false;  // kind 4: the number was an int (x + 3), not a float (x + 3.0): they promote differently
};

struct OutDesc {
  int alias = -1;  // >= 0: the return is this argument
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

struct Param {
  int kind = 0;  // 0: bytes, 1: input tensor pointer, 2: output pointer, 3: workspace pointer, 4: list item pointer
  int index = 0, sub = 0;
  std::vector<uint8_t> bytes;
};

struct Launch {
  uintptr_t fn = 0;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  unsigned shared = 0;
  bool cooperative = false;  // cuLaunchCooperativeKernel: every block resident at once, or an error
  std::vector<Param> params;
};

struct Plan {
  c10::Device device{c10::kCPU};
  std::vector<ArgDesc> args;
  std::vector<OutDesc> outs;
  std::vector<std::pair<int64_t, bool>> workspaces;  // bytes, zero-filled
  std::vector<Launch> launches;
  bool distinct_storage = false;  // an op that writes an argument: no two tensor arguments may share storage
  std::atomic<bool> dead{false};  // failed on a call: never tried again, its calls go to PyTorch
  std::atomic<int64_t> hits{0};
  // The first tensor argument's index and fingerprints (sizes; sizes and dtype), set by make_plan: a call
  // is compared in full only with the plans whose fingerprint its own first tensor has. An op with many
  // variants (Qwen3.5: 25 of aten::mul) scanned every plan in full on every call, and every miss of such
  // an op paid for all of them.
  int first = -1;
  uint64_t sizes_fp = 0, fp = 0;
  // The targets the variant was proven for, one bit each (cpp_router.TARGET_BITS); 0: any target. A hit
  // under another target is declined (the call goes to PyTorch), as in the Python router.
  uint32_t targets = 0;
  // Its kernels may round otherwise from run to run (engine.verify.tolerance.REORDERING_FAMILIES): a hit while
  // deterministic algorithms are on goes to PyTorch, as in the Python router.
  bool reorders = false;
};

// One per routed (op, dispatch key). The kernel registered for the op holds it, so a call reaches its
// route without a lookup; g_routes holds it too, for install, uninstall and the counters.
struct Route {
  // The kernel a miss calls: the one below ours. Replaced where that one was deregistered (rebind); a miss on
  // another thread may still be calling the one replaced, so every one taken stays in `originals` (under g_mutex)
  // while the route lives.
  std::atomic<const c10::SafeKernelFunction*> original{nullptr};
  std::vector<std::unique_ptr<c10::SafeKernelFunction>> originals;
  std::vector<std::shared_ptr<Plan>> plans;
  // What registering the override again needs (rebind), under g_mutex: the route's key in g_routes, the
  // op's namespace and name, the dispatch key; the kernel object registered now and the debug name of that
  // registration, ours alone (it tells whether ours is the kernel dispatched for the key); and the kernel objects
  // of earlier registrations of this route, kept until uninstall (a call may still be running in one).
  std::string rk, ns, qualified;
  c10::DispatchKey key = c10::DispatchKey::Undefined;
  c10::OperatorKernel* kernel = nullptr;
  std::string mine;
  std::vector<c10::intrusive_ptr<c10::OperatorKernel>> retired;
  // An original that failed with no kernel left below ours: registrations go on top, so none comes while ours
  // stays, and each miss would otherwise register again (and retire a kernel object).
  const c10::SafeKernelFunction* bare = nullptr;
  std::atomic<int64_t> misses{0};
  std::atomic<int64_t> near_misses{0};  // misses whose first tensor had a variant's sizes
  std::atomic<int64_t> target_declines{0};  // hits declined: the variant was not proven for the call's target
  std::atomic<int64_t> determinism_declines{0};  // hits declined: deterministic algorithms on, the variant may reorder
  std::atomic<int64_t> format_declines{0};  // a proven key that PyTorch takes for another memory format (eager)
  std::mutex near_mutex;
  std::vector<std::string> near_keys;   // the first few such calls, described
};

constexpr size_t kNearMissKeys = 8;  // as the Python router's NEAR_MISS_KEYS

std::mutex g_mutex;
std::unordered_map<std::string, std::shared_ptr<Route>> g_routes;  // "name.overload@Key"
std::unordered_map<std::string, std::unique_ptr<torch::Library>> g_libs;  // the registration of each route

using LaunchFn = int (*)(uintptr_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);
LaunchFn g_launch = nullptr;
using CoopFn = int (*)(uintptr_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**);
CoopFn g_coop = nullptr;
std::atomic<bool> g_active{true};  // false: every routed call goes to PyTorch (runtime.suspended())
std::atomic<int> g_prefill{0};     // confirmation only: 1 poisons fresh outputs with NaN, 2 with a sentinel
// The target bit set by Python around compiled code of a cast backend (runtime.target_scope); -1: none, and
// the call's target is CUDA graphs while the current stream captures, eager otherwise.
thread_local int t_target = -1;
constexpr uint32_t kEagerBit = 1u << 0, kGraphsBit = 1u << 1;  // as cpp_router.TARGET_BITS

uint32_t call_target(const Plan& plan) {
  if (t_target >= 0) return 1u << t_target;
  if ((plan.targets & (kEagerBit | kGraphsBit)) == (kEagerBit | kGraphsBit)) return kEagerBit;  // either: no query
  if (plan.device.is_cuda() &&
      c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None)
    return kGraphsBit;
  return kEagerBit;
}

LaunchFn launcher() {
  if (!g_launch) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib != nullptr, "kforge router: cannot open libcuda.so.1");
    g_launch = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
    TORCH_CHECK(g_launch != nullptr, "kforge router: no cuLaunchKernel in libcuda.so.1");
    g_coop = reinterpret_cast<CoopFn>(dlsym(lib, "cuLaunchCooperativeKernel"));
  }
  return g_launch;
}

int64_t alignment(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  if ((v & 15) == 0) return 16;
  return static_cast<int64_t>(v & (~v + 1));
}

bool same_value(const c10::IValue& a, const c10::IValue& b) {
  if (a.isNone() || b.isNone()) return a.isNone() && b.isNone();
  if (b.isBool()) return a.isBool() && a.toBool() == b.toBool();
  if (b.isInt()) return a.isInt() && a.toInt() == b.toInt();
  if (b.isDouble())  // 0.0 and -0.0 compare equal but give zeros of other signs (x * -0.0)
    return a.isDouble() && a.toDouble() == b.toDouble() && std::signbit(a.toDouble()) == std::signbit(b.toDouble());
  if (b.isIntList()) {
    if (!a.isIntList()) return false;
    auto x = a.toIntVector(), y = b.toIntVector();
    return x == y;
  }
  if (b.isString()) return a.isString() && a.toStringRef() == b.toStringRef();
  return false;  // anything else never matches: the call goes to PyTorch
}

uint64_t sizes_fingerprint(c10::IntArrayRef sizes) {
  uint64_t h = 1469598103934665603ull ^ sizes.size();
  for (auto v : sizes) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  return h;
}

uint64_t with_dtype(uint64_t sizes_fp, c10::ScalarType dtype) {
  return (sizes_fp ^ (static_cast<uint64_t>(dtype) + 1)) * 1099511628211ull;
}

// A call's fingerprints at one argument index, computed once per call and index.
struct CallPrint {
  int index = -1;
  bool tensor = false;
  uint64_t sizes_fp = 0, fp = 0;
  void at(c10::ArrayRef<c10::IValue> args, int i) {
    if (i == index) return;
    index = i;
    tensor = i < static_cast<int>(args.size()) && args[i].isTensor() && args[i].toTensor().defined();
    if (tensor) {
      const auto& t = args[i].toTensor();
      sizes_fp = sizes_fingerprint(t.sizes());
      fp = with_dtype(sizes_fp, t.scalar_type());
    }
  }
};

// Strides as the guard compares them (engine.cast.guard.key_strides): a size-1 dim's is never used to address
// an element (kernels get data pointers only) and eager, Inductor and meta kernels disagree on it.
bool key_strides_equal(at::IntArrayRef sizes, at::IntArrayRef strides, const std::vector<int64_t>& want) {
  if (strides.size() != want.size()) return false;
  for (size_t d = 0; d < want.size(); ++d)
    if (sizes[d] != 1 && strides[d] != want[d]) return false;
  return true;
}

// Whether PyTorch takes a 4-D (5-D) tensor for channels-last, reading the strides of size-1 dims too (what
// suggest_memory_format() answers from); -1 where no size-1 dim leaves it to those strides. Two tensors equal
// under key_strides_equal can differ here, and eager may lay its outputs out otherwise for each (an upsampling
// of bf16[1,512,128,128] returns channels-last at strides (8388608,1,65536,512), NCHW at (512,1,65536,512)).
// Outside compiled code a plan serves only calls alike in this (engine.cast.guard.proven_formats); a call that
// matches a plan but for it is a format decline, not a miss; compiled code holds its own layouts and gets the
// strides it asserts (Held).
int cl_by_strides(at::IntArrayRef sizes, at::IntArrayRef strides) {
  if (sizes.size() != 4 && sizes.size() != 5) return -1;
  if (std::find(sizes.begin(), sizes.end(), 1) == sizes.end()) return -1;
  return sizes.size() == 4 ? c10::is_channels_last_strides_2d(sizes, strides)
                           : c10::is_channels_last_strides_3d(sizes, strides);
}

// Whether a call is the plan's: kMatch, kNoMatch, or kOtherFormat where only cl_by_strides tells them apart.
enum Match { kNoMatch = 0, kMatch = 1, kOtherFormat = 2 };

Match matches(const Plan& plan, c10::ArrayRef<c10::IValue> args) {
  if (args.size() != plan.args.size()) return kNoMatch;
  bool other_format = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& d = plan.args[i];
    const auto& v = args[i];
    switch (d.kind) {
      case 0:
        if (!v.isNone()) return kNoMatch;
        break;
      case 1: {
        if (!v.isTensor()) return kNoMatch;
        const auto& t = v.toTensor();
        if (!t.defined() || t.scalar_type() != d.dtype || t.sizes() != c10::IntArrayRef(d.sizes) ||
            !key_strides_equal(t.sizes(), t.strides(), d.strides) || t.get_device() != d.device ||
            t.is_neg() != d.neg || t.is_conj() != d.conj || alignment(t.data_ptr()) != d.align)
          return kNoMatch;
        if (d.cl >= 0 && t_target < 2 && cl_by_strides(t.sizes(), t.strides()) != d.cl) other_format = true;
        break;
      }
      case 2:
        if (!same_value(v, d.value)) return kNoMatch;
        break;
      case 4: {
        if (!v.isTensor()) return kNoMatch;
        const auto& t = v.toTensor();
        if (!t.defined() || t.dim() != 0 || !t.unsafeGetTensorImpl()->is_wrapped_number() || !t.is_cpu())
          return kNoMatch;
        double x;
        switch (t.scalar_type()) {  // an int number where a float was proven (or back) promotes otherwise
          case at::kDouble: if (d.integral) return kNoMatch; x = *t.const_data_ptr<double>(); break;
          case at::kLong: if (!d.integral) return kNoMatch; x = static_cast<double>(*t.const_data_ptr<int64_t>()); break;
          default: return kNoMatch;  // a bool or complex number: PyTorch
        }
        if (x != d.number || std::signbit(x) != std::signbit(d.number)) return kNoMatch;
        break;
      }
      default:
        return kNoMatch;
    }
  }
  if (plan.distinct_storage) {
    std::vector<const void*> seen;
    for (const auto& v : args) {
      if (!v.isTensor()) continue;
      const auto& t = v.toTensor();
      if (!t.defined() || t.numel() == 0) continue;
      const void* s = t.storage().data();
      for (auto q : seen)
        if (q == s) return kNoMatch;
      seen.push_back(s);
    }
  }
  return other_format ? kOtherFormat : kMatch;
}

// A miss that looks meant for a variant: the call's first tensor argument has that variant's sizes.
bool near(const Plan& plan, c10::ArrayRef<c10::IValue> args, CallPrint& print) {
  if (plan.first < 0 || plan.first >= static_cast<int>(args.size())) return false;
  print.at(args, plan.first);
  return print.tensor && print.sizes_fp == plan.sizes_fp &&
         args[plan.first].toTensor().sizes() == c10::IntArrayRef(plan.args[plan.first].sizes);
}

// Built without iostreams: on an H200 host (2026-11-30) the router crashed on the first guard miss, where
// this description was the only std::ostringstream the router used on a call; the CPU-key tests never
// crashed. Not proven to be the cause. Plain string building has no locale or stream state to disagree
// about between the compiler that built this file and the C++ runtime the process loaded.
std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

std::string ints(c10::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

std::string describe(c10::ArrayRef<c10::IValue> args) {
  std::string s;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i) s += ", ";
    const auto& v = args[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number() &&
        v.toTensor().is_cpu()) {  // a Python number in a Tensor slot (x + 1e-6): its value says more
      const auto& t = v.toTensor();
      switch (t.scalar_type()) {
        case at::kDouble: s += number(*t.const_data_ptr<double>()); break;
        case at::kLong: s += std::to_string(*t.const_data_ptr<int64_t>()); break;
        case at::kBool: s += *t.const_data_ptr<bool>() ? "True" : "False"; break;
        default: s += c10::toString(t.scalar_type()); s += " number";
      }
    } else if (v.isTensor() && v.toTensor().defined()) {
      const auto& t = v.toTensor();
      s += c10::toString(t.scalar_type());
      s += ints(t.sizes()) + "(s=" + ints(t.strides()) + ", align ";
      s += std::to_string(t.numel() ? alignment(t.data_ptr()) : 16) + ", ";
      s += t.is_cuda() ? "cuda:" + std::to_string(t.get_device()) : (t.is_cpu() ? std::string("cpu") : "other");
      s += ")";
    } else if (v.isNone()) {
      s += "None";
    } else if (v.isBool()) {
      s += v.toBool() ? "True" : "False";
    } else if (v.isInt()) {
      s += std::to_string(v.toInt());
    } else if (v.isDouble()) {
      s += number(v.toDouble());
    } else if (v.isIntList()) {
      s += ints(v.toIntVector());
    } else if (v.isString()) {
      s += "'" + v.toStringRef() + "'";
    } else {
      s += v.tagKind();
    }
  }
  return s;
}

void run(Plan& plan, torch::jit::Stack* stack, size_t nargs) {
  const auto dev = plan.device;
  // cuLaunchKernel uses the calling thread's current context: make it the variant's device (a model on
  // cuda:1 called while cuda:0 is current), as the device guard of PyTorch's own CUDA kernels does.
  std::optional<c10::cuda::CUDAGuard> device_guard;
  if (dev.is_cuda()) device_guard.emplace(dev.index());
  auto args = torch::jit::last(*stack, nargs);
  std::vector<at::Tensor> outs;
  outs.reserve(plan.outs.size());
  for (const auto& o : plan.outs) {
    if (o.alias >= 0) {
      outs.push_back(args[o.alias].toTensor());
    } else {
      outs.push_back(at::empty_strided(o.sizes, o.strides,
                                       at::TensorOptions().dtype(o.dtype).device(dev)));
    }
  }
  if (int how = g_prefill.load()) {  // as engine.lane.launcher.prefill_: unwritten outputs cannot pass
    for (size_t i = 0; i < outs.size(); ++i) {
      auto& t = outs[i];
      if (plan.outs[i].alias >= 0 || t.numel() == 0) continue;
      const bool fp = t.is_floating_point() || t.is_complex(), boolean = t.scalar_type() == at::kBool;
      if (how == 1) {
        if (fp) t.fill_(std::numeric_limits<double>::quiet_NaN());
        else t.fill_(boolean ? 1 : -1);
      } else {
        if (fp) t.fill_(t.scalar_type() == at::kHalf ? -123.25 : -1234.5);
        else t.fill_(boolean ? 0 : 7);
      }
    }
  }
  std::vector<at::Tensor> ws;
  for (const auto& w : plan.workspaces) {
    auto t = at::empty({std::max<int64_t>(1, w.first)},
                       at::TensorOptions().dtype(at::kByte).device(dev));
    if (w.second) t.zero_();
    ws.push_back(t);
  }
  if (!plan.launches.empty()) {
    auto stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
    auto launch = launcher();
    for (const auto& l : plan.launches) {
      std::vector<uint64_t> ptrs(l.params.size(), 0);
      std::vector<void*> argv(l.params.size(), nullptr);
      for (size_t i = 0; i < l.params.size(); ++i) {
        const auto& p = l.params[i];
        switch (p.kind) {
          case 0: argv[i] = const_cast<uint8_t*>(p.bytes.data()); continue;
          case 1: {
            const auto& v = args[p.index];
            ptrs[i] = v.isTensor() ? reinterpret_cast<uint64_t>(v.toTensor().data_ptr()) : 0;
            break;
          }
          case 2: ptrs[i] = reinterpret_cast<uint64_t>(outs[p.index].data_ptr()); break;
          case 3: ptrs[i] = reinterpret_cast<uint64_t>(ws[p.index].data_ptr()); break;
          case 4: {
            auto list = args[p.index].toList();
            c10::IValue item = list.get(p.sub);
            ptrs[i] = item.isTensor() ? reinterpret_cast<uint64_t>(item.toTensor().data_ptr()) : 0;
            break;
          }
        }
        argv[i] = &ptrs[i];
      }
      int err;
      if (l.cooperative) {
        TORCH_CHECK(g_coop != nullptr, "kforge router: no cuLaunchCooperativeKernel in libcuda.so.1");
        err = g_coop(l.fn, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.shared,
                     static_cast<void*>(stream), argv.data());
      } else {
        err = launch(l.fn, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.shared,
                     static_cast<void*>(stream), argv.data(), nullptr);
      }
      TORCH_CHECK(err == 0, "kforge router: ", l.cooperative ? "cuLaunchCooperativeKernel" : "cuLaunchKernel",
                  " failed (CUresult ", err, ")");
    }
  }
  torch::jit::drop(*stack, nargs);
  for (auto& t : outs) torch::jit::push(*stack, std::move(t));
}

std::string route_key(const c10::OperatorName& name, const std::string& key) {
  return name.name + "." + name.overload_name + "@" + key;
}

// A miss goes to the kernel registered before ours. Should that kernel lead back here for the same call
// (the kernel PyTorch handed us at install resolving to the router itself), each miss would recurse until
// the stack overflows and the process dies with SIGSEGV; past a depth no real op nests to, it is an error.
thread_local int t_depth = 0;

// Inputs compiled code passes as Inductor holds them (engine.cast.compose, `inputs_as_held`): per op
// ("name.overload"), the (sizes, strides) of first tensors a variant was proven for where the graph was traced
// with a contiguous one, and the strides compiled code asserts of the call's tensor outputs (the op's meta
// kernel's; an empty entry: not known). Such a call that goes to PyTorch's kernel (a miss, a declined hit, the
// router suspended) inside compiled code gets its first tensor made contiguous first, what PyTorch's kernel
// may require (CUDA native_group_norm rejects channels-last input), and its outputs copied into the asserted
// strides (torch 2.11's meta kernel gives a channels-last GroupNorm output there, its CUDA kernel contiguous).
struct Held {
  std::vector<int64_t> sizes, strides;
  std::vector<std::vector<int64_t>> outputs;
};
std::atomic<bool> g_any_held{false};
std::mutex g_held_mutex;
std::unordered_map<std::string, std::vector<Held>> g_held;

// Whether `first` is a held input of `op`; if so, `outputs` gets the strides to give its outputs.
bool held_call(const c10::OperatorHandle& op, const c10::IValue& first, std::vector<std::vector<int64_t>>* outputs) {
  if (!first.isTensor()) return false;
  const auto& t = first.toTensor();
  if (!t.defined() || t.is_contiguous()) return false;
  const auto& name = op.operator_name();
  std::lock_guard<std::mutex> g(g_held_mutex);
  auto it = g_held.find(name.name + "." + name.overload_name);
  if (it == g_held.end()) return false;
  for (const auto& h : it->second)
    if (t.sizes() == c10::IntArrayRef(h.sizes) && key_strides_equal(t.sizes(), t.strides(), h.strides)) {
      *outputs = h.outputs;
      return true;
    }
  return false;
}

// Whether `strides` lay out a tensor of `sizes` as `want` does: equal at every dim of size > 1, as compiled
// code's assert_size_stride compares them (engine.ops.same_strides); an empty tensor has any layout.
bool same_strides(at::IntArrayRef sizes, at::IntArrayRef strides, const std::vector<int64_t>& want) {
  if (sizes.size() != want.size()) return false;
  for (int64_t n : sizes)
    if (n == 0) return true;
  return key_strides_equal(sizes, strides, want);
}

// The op's returns on the stack, each tensor whose strides differ from its entry in `outputs` (same_strides)
// copied into those strides. Returns that are not all tensors (a tensor list) are left as they are.
void restride_returns(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                      const std::vector<std::vector<int64_t>>& outputs) {
  size_t nret = op.schema().returns().size();
  if (outputs.empty() || nret > stack->size()) return;
  size_t base = stack->size() - nret;
  for (size_t i = 0; i < nret; ++i)
    if (!(*stack)[base + i].isTensor()) return;
  for (size_t i = 0; i < nret && i < outputs.size(); ++i) {
    if (outputs[i].empty()) continue;
    auto& v = (*stack)[base + i];
    const at::Tensor t = v.toTensor();
    if (!t.defined() || t.dim() != static_cast<int64_t>(outputs[i].size()) ||
        same_strides(t.sizes(), t.strides(), outputs[i]))
      continue;
    at::Tensor r = at::empty_strided(t.sizes(), outputs[i], t.options());
    r.copy_(t);
    v = c10::IValue(std::move(r));
  }
}

bool rebind(Route& route, const c10::OperatorHandle& op, const c10::SafeKernelFunction* failed,
            std::shared_ptr<Route>* keep);

// Whether `e` is `original` refusing a call because its kernel was deregistered (SafeKernelFunction::callBoxed
// checks that first, before the stack is touched), not an error from inside a kernel it called.
bool invalidated(const c10::Error& e, const c10::SafeKernelFunction& original) {
  return e.msg() == "SafeKernelFunction has been invalidated " + original.debug();
}

void call_original(Route& route, const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  TORCH_CHECK(t_depth < 16, "kforge router: a guard miss of ", op.operator_name(),
              " re-entered the router 16 times: the original kernel leads back to the router");
  struct Depth {
    Depth() { ++t_depth; }
    ~Depth() { --t_depth; }
  } depth;
  bool held = false;
  std::vector<std::vector<int64_t>> outputs;
  if (g_any_held.load(std::memory_order_relaxed) && t_target >= 2) {  // compiled code (cpp_router.TARGET_BITS)
    size_t nargs = op.schema().arguments().size();
    if (nargs > 0 && nargs <= stack->size()) {
      auto& first = (*stack)[stack->size() - nargs];
      held = held_call(op, first, &outputs);
      if (held) first = first.toTensor().contiguous();
    }
  }
  const c10::SafeKernelFunction* original = route.original.load(std::memory_order_acquire);
  const size_t before = stack->size();
  // The kernel we took as the original may have been another library's override, registered before ours and
  // removed while ours is installed: torch invalidates it, and every miss raised where eager runs. Then the
  // kernel now below ours becomes the original (as in the Python router). Rebinding drops and makes again our
  // registration, whose kernel object holds the route: `keep` holds it until this call is done.
  std::shared_ptr<Route> keep;
  bool rebound = false;
  try {
    original->callBoxed(op, ks, stack);
  } catch (const c10::Error& e) {
    if (stack->size() != before || !invalidated(e, *original) || !rebind(route, op, original, &keep)) throw;
    rebound = true;
  }
  if (rebound) keep->original.load(std::memory_order_acquire)->callBoxed(op, ks, stack);
  if (held) restride_returns(op, stack, outputs);
}

void set_held(const std::string& name, const std::string& overload, std::vector<int64_t> sizes,
              std::vector<int64_t> strides, std::vector<std::vector<int64_t>> outputs) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  const auto& on = op.operator_name();
  std::lock_guard<std::mutex> g(g_held_mutex);
  auto& entries = g_held[on.name + "." + on.overload_name];
  for (auto& h : entries)  // one entry per layout, a size-1 dim's stride aside (as held_call matches them)
    if (h.sizes == sizes && key_strides_equal(sizes, strides, h.strides)) {
      h.outputs = std::move(outputs);
      g_any_held = true;
      return;
    }
  entries.push_back(Held{std::move(sizes), std::move(strides), std::move(outputs)});
  g_any_held = true;
}

void route_call(Route& route, const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (!g_active.load(std::memory_order_relaxed)) {  // suspended: straight to PyTorch, not counted
    call_original(route, op, ks, stack);
    return;
  }
  size_t nargs = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, nargs);
  CallPrint print;
  bool other_format = false;
  for (auto& plan : route.plans) {
    if (plan->dead) continue;
    if (plan->first >= 0) {
      print.at(args, plan->first);
      if (!print.tensor || print.fp != plan->fp) continue;  // cannot match: not compared in full
    }
    const Match m = matches(*plan, args);
    if (m == kOtherFormat) other_format = true;  // another plan may be proven on this call's format
    if (m == kMatch) {
      if (plan->targets != 0 && (plan->targets & call_target(*plan)) == 0) {
        route.target_declines++;  // proven, but not for this target: PyTorch's kernel, not a miss
        call_original(route, op, ks, stack);
        return;
      }
      if (plan->reorders && at::globalContext().deterministicAlgorithms()) {
        route.determinism_declines++;
        call_original(route, op, ks, stack);
        return;
      }
      try {
        run(*plan, stack, nargs);  // leaves the stack untouched unless it succeeds
        plan->hits++;
        return;
      } catch (const std::exception& e) {
        plan->dead = true;
        TORCH_WARN("kforge cast: a variant of ", op.operator_name(), " failed on a call and stays on PyTorch ",
                   "from now on: ", e.what());
        break;
      }
    }
  }
  if (other_format) {  // a proven key, laid out by eager otherwise than every proof's: eager's kernel, not a miss
    route.format_declines++;
    call_original(route, op, ks, stack);
    return;
  }
  route.misses++;
  for (auto& plan : route.plans) {
    if (near(*plan, args, print)) {
      route.near_misses++;
      std::lock_guard<std::mutex> g(route.near_mutex);
      if (route.near_keys.size() < kNearMissKeys) {
        auto d = describe(args);
        if (std::find(route.near_keys.begin(), route.near_keys.end(), d) == route.near_keys.end())
          route.near_keys.push_back(std::move(d));
      }
      break;
    }
  }
  call_original(route, op, ks, stack);
}

// The boxed kernel registered for a routed op: it holds its route (no lookup, no lock per call).
struct RouterKernel final : public c10::OperatorKernel {
  explicit RouterKernel(std::shared_ptr<Route> r) : route(std::move(r)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    route_call(*route, op, ks, stack);
  }
  std::shared_ptr<Route> route;
};

uint64_t g_registrations = 0;  // under g_mutex: numbers each registration's debug name

// Registers `route`'s override over the kernel dispatched now for its op and key. Under g_mutex.
void register_route(const std::shared_ptr<Route>& route) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, route->ns, route->key, __FILE__, __LINE__);
  auto kernel = std::make_unique<RouterKernel>(route);
  c10::OperatorKernel* raw = kernel.get();
  // torch names a registration by its file and line, the same for every registration made here: a name of its
  // own is what tells ours from another (rebind reads the name of the kernel dispatched for the key).
  std::string mine = "registered at " __FILE__ ":" + std::to_string(__LINE__) + " (kforge router, " + route->rk +
                     ", registration " + std::to_string(++g_registrations) + ")";
  lib->impl(route->qualified.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)).debug(mine));
  route->kernel = raw;
  route->mine = std::move(mine);
  g_libs[route->rk] = std::move(lib);
}

// After `failed`, the route's original, was deregistered: takes the kernel now below ours as the original, by
// dropping our registration, reading the kernel dispatched then and registering ours again. Only while ours is
// the kernel dispatched for the key: registering again puts ours on top, which would reorder an override
// registered after ours (that miss raises, as in the Python router). Whether the original may be called again;
// `keep` then holds the route.
bool rebind(Route& route, const c10::OperatorHandle& op, const c10::SafeKernelFunction* failed,
            std::shared_ptr<Route>* keep) {
  std::lock_guard<std::mutex> g(g_mutex);
  auto it = g_routes.find(route.rk);
  if (it == g_routes.end() || it->second.get() != &route) return false;  // uninstalled meanwhile
  *keep = it->second;
  if (route.original.load(std::memory_order_acquire) != failed) return true;  // another thread rebound it
  if (failed == route.bare || op.getComputedKernelForDispatchKey(route.key).debug() != route.mine) return false;
  // Dropping the registration would free the kernel object this call runs in, and others' calls may be in it.
  // Until it is made again, calls on other threads go to the kernel below, uncounted, as in eager.
  route.retired.push_back(c10::intrusive_ptr<c10::OperatorKernel>::unsafe_reclaim_from_nonowning(route.kernel));
  g_libs[route.rk].reset();
  std::unique_ptr<c10::SafeKernelFunction> below;
  try {
    below = std::make_unique<c10::SafeKernelFunction>(op.getComputedKernelForDispatchKey(route.key));
  } catch (const c10::Error&) {  // nothing below ours now: the miss raises as it did
  }
  register_route(*keep);
  if (!below) {
    route.bare = failed;
    return false;
  }
  route.original.store(below.get(), std::memory_order_release);
  route.originals.push_back(std::move(below));
  return true;
}

// ---- Python surface ------------------------------------------------------------------------------

std::shared_ptr<Plan> make_plan(const std::string& device, py::list args, py::list outs, py::list workspaces,
                                py::list launches, bool distinct_storage) {
  auto plan = std::make_shared<Plan>();
  plan->device = c10::Device(device);
  plan->distinct_storage = distinct_storage;
  for (auto a : args) {
    auto t = a.cast<py::dict>();
    ArgDesc d;
    d.kind = t["kind"].cast<int>();
    if (d.kind == 1) {
      d.dtype = t["dtype"].cast<at::Tensor>().scalar_type();  // an empty tensor of the dtype
      d.sizes = t["sizes"].cast<std::vector<int64_t>>();
      d.strides = t["strides"].cast<std::vector<int64_t>>();
      d.align = t["align"].cast<int64_t>();
      d.device = t["device"].cast<int64_t>();
      d.neg = t["neg"].cast<bool>();
      d.conj = t["conj"].cast<bool>();
      d.cl = cl_by_strides(d.sizes, d.strides);
    } else if (d.kind == 2) {
      auto tag = t["tag"].cast<std::string>();
      if (tag == "bool") d.value = c10::IValue(t["value"].cast<bool>());
      else if (tag == "int") d.value = c10::IValue(t["value"].cast<int64_t>());
      else if (tag == "float") d.value = c10::IValue(t["value"].cast<double>());
      else if (tag == "ints") d.value = c10::IValue(t["value"].cast<std::vector<int64_t>>());
      else if (tag == "str") d.value = c10::IValue(t["value"].cast<std::string>());
      else d.kind = 3;  // a value the router cannot compare: never matches
    } else if (d.kind == 4) {
      d.number = t["value"].cast<double>();
      d.integral = t.contains("integral") && t["integral"].cast<bool>();
    }
    plan->args.push_back(std::move(d));
  }
  for (size_t i = 0; i < plan->args.size(); ++i) {
    if (plan->args[i].kind != 1) continue;
    plan->first = static_cast<int>(i);
    plan->sizes_fp = sizes_fingerprint(plan->args[i].sizes);
    plan->fp = with_dtype(plan->sizes_fp, plan->args[i].dtype);
    break;
  }
  for (auto o : outs) {
    auto t = o.cast<py::dict>();
    OutDesc d;
    d.alias = t["alias"].cast<int>();
    if (d.alias < 0) {
      d.dtype = t["dtype"].cast<at::Tensor>().scalar_type();
      d.sizes = t["sizes"].cast<std::vector<int64_t>>();
      d.strides = t["strides"].cast<std::vector<int64_t>>();
    }
    plan->outs.push_back(std::move(d));
  }
  for (auto w : workspaces) {
    auto t = w.cast<py::tuple>();
    plan->workspaces.emplace_back(t[0].cast<int64_t>(), t[1].cast<bool>());
  }
  for (auto l : launches) {
    auto t = l.cast<py::dict>();
    Launch L;
    L.fn = t["fn"].cast<uintptr_t>();
    auto g = t["grid"].cast<std::vector<unsigned>>();
    auto b = t["block"].cast<std::vector<unsigned>>();
    for (int i = 0; i < 3; ++i) { L.grid[i] = g[i]; L.block[i] = b[i]; }
    L.shared = t["shared"].cast<unsigned>();
    L.cooperative = t.contains("cooperative") && t["cooperative"].cast<bool>();
    for (auto p : t["params"].cast<py::list>()) {
      auto q = p.cast<py::tuple>();
      Param P;
      P.kind = q[0].cast<int>();
      if (P.kind == 0) {
        auto s = q[1].cast<std::string>();
        P.bytes.assign(s.begin(), s.end());
      } else {
        P.index = q[1].cast<int>();
        P.sub = q.size() > 2 ? q[2].cast<int>() : 0;
      }
      L.params.push_back(std::move(P));
    }
    plan->launches.push_back(std::move(L));
  }
  return plan;
}

void install(const std::string& name, const std::string& overload, const std::string& key,
             std::vector<std::shared_ptr<Plan>> plans) {
  auto& dispatcher = c10::Dispatcher::singleton();
  auto op = dispatcher.findSchemaOrThrow(name.c_str(), overload.c_str());
  auto k = c10::parseDispatchKey(key);
  std::string rk = route_key(op.operator_name(), key);
  std::lock_guard<std::mutex> g(g_mutex);
  TORCH_CHECK(g_routes.find(rk) == g_routes.end(), "kforge router: ", rk, " is routed already");
  auto route = std::make_shared<Route>();
  route->originals.push_back(std::make_unique<c10::SafeKernelFunction>(op.getComputedKernelForDispatchKey(k)));
  route->original = route->originals.back().get();
  route->plans = std::move(plans);
  TORCH_CHECK(k == c10::DispatchKey::CUDA || k == c10::DispatchKey::CPU, "kforge router: dispatch key ", key,
              " is not supported");
  auto base = name.substr(name.find("::") + 2);
  route->rk = rk;
  route->ns = name.substr(0, name.find("::"));
  route->qualified = overload.empty() ? base : base + "." + overload;
  route->key = k;
  register_route(route);
  g_routes[rk] = route;
}

void uninstall(const std::string& name, const std::string& overload, const std::string& key) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  std::unique_ptr<torch::Library> lib;
  std::vector<c10::intrusive_ptr<c10::OperatorKernel>> retired;  // each holds the route: released last
  {
    std::lock_guard<std::mutex> g(g_mutex);
    auto rk = route_key(op.operator_name(), key);
    auto it = g_routes.find(rk);
    if (it == g_routes.end()) return;
    retired.swap(it->second->retired);
    g_routes.erase(it);
    auto l = g_libs.find(rk);
    if (l != g_libs.end()) {
      lib = std::move(l->second);
      g_libs.erase(l);
    }
  }
  lib.reset();  // deregisters the override (and with it the kernel's hold on the route): the original is back
}

py::dict stats(const std::string& name, const std::string& overload, const std::string& key) {
  py::dict out;
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  std::lock_guard<std::mutex> g(g_mutex);
  auto it = g_routes.find(route_key(op.operator_name(), key));
  if (it == g_routes.end()) return out;
  py::list hits;
  for (auto& p : it->second->plans) hits.append(p->hits.load());
  out["hits"] = hits;
  out["misses"] = it->second->misses.load();
  out["near_misses"] = it->second->near_misses.load();
  out["target_declines"] = it->second->target_declines.load();
  out["determinism_declines"] = it->second->determinism_declines.load();
  out["format_declines"] = it->second->format_declines.load();
  {
    std::lock_guard<std::mutex> n(it->second->near_mutex);
    out["near_keys"] = it->second->near_keys;
  }
  return out;
}

void reset(const std::string& name, const std::string& overload, const std::string& key) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  std::lock_guard<std::mutex> g(g_mutex);
  auto it = g_routes.find(route_key(op.operator_name(), key));
  if (it == g_routes.end()) return;
  for (auto& p : it->second->plans) p->hits = 0;
  it->second->misses = 0;
  it->second->near_misses = 0;
  it->second->target_declines = 0;
  it->second->determinism_declines = 0;
  it->second->format_declines = 0;
  std::lock_guard<std::mutex> n(it->second->near_mutex);
  it->second->near_keys.clear();
}

// ---- crash diagnostics ----------------------------------------------------------------------------
// KFORGE_ROUTER_BACKTRACE=1 (the self-test sets it): a fatal signal prints the native stack (addresses in
// this library resolve with `addr2line -f -C -e <the .so> <offset>`; it is built with -g), then the
// handler that was there before (Python's faulthandler: the Python stack) runs and the signal takes its
// course. Only async-signal-safe calls once installed: write, backtrace (preloaded), sigaction, raise.
struct sigaction g_previous[65];

void on_fatal(int sig) {
  static const char head[] = "\nkforge router: fatal signal; native backtrace (innermost first):\n";
  ssize_t ignored = write(2, head, sizeof(head) - 1);
  (void)ignored;
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  sigaction(sig, &g_previous[sig], nullptr);  // Python's handler (or the default) next
  raise(sig);
}

void install_crash_backtrace() {
  void* warm[2];
  backtrace(warm, 2);  // loads libgcc's unwinder now, not inside the handler
  // The handler runs on its own stack, so a stack overflow (runaway recursion) still prints.
  static std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    struct sigaction sa {};
    sa.sa_handler = on_fatal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_NODEFER | SA_ONSTACK;
    sigaction(sig, &sa, &g_previous[sig]);
  }
}

void set_active(bool on) { g_active = on; }

void set_target(int bit) { t_target = bit; }

void set_plan_targets(const std::shared_ptr<Plan>& plan, int64_t mask) { plan->targets = static_cast<uint32_t>(mask); }
void set_plan_reorders(const std::shared_ptr<Plan>& plan, bool reorders) { plan->reorders = reorders; }

void set_prefill(int how) { g_prefill = how; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Plan, std::shared_ptr<Plan>>(m, "Plan");
  m.def("make_plan", &make_plan);
  m.def("install", &install);
  m.def("uninstall", &uninstall);
  m.def("stats", &stats);
  m.def("reset", &reset);
  m.def("set_active", &set_active);
  m.def("set_held", &set_held);
  m.def("set_target", &set_target);
  m.def("set_plan_targets", &set_plan_targets);
  m.def("set_plan_reorders", &set_plan_reorders);
  m.def("set_prefill", &set_prefill);
  m.def("install_crash_backtrace", &install_crash_backtrace);
}
