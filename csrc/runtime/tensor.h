// fk's view of torch: PyTorch's stable C ABI only (torch/csrc/stable, torch/headeronly).
//
// libfk is built with TORCH_TARGET_VERSION = 2.11, so it loads in every torch from 2.11 on.
// This header gives the ops the few pieces they need in one place:
//   - aliases: Tensor, ScalarType, Device and the dtype constants;
//   - FK_CHECK: throws std::runtime_error with exactly the message given (torch turns it
//     into a RuntimeError carrying that text);
//   - fk::str(...) for messages, with ScalarType, Device and shapes printed as torch does;
//   - fk::aten: ATen operators called by name through the dispatcher (torch_call_dispatcher),
//     with tensor arithmetic operators for the CPU reference kernels. The 2.11 dispatcher
//     shim converts no `Scalar` argument, so scalars travel as 0-dim tensors and only
//     Scalar-free overloads are called (add is subtract with alpha -1).
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>

#include <array>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace fk {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using Device = torch::stable::Device;
using DeviceType = torch::headeronly::DeviceType;
using IntArrayRef = torch::headeronly::IntHeaderOnlyArrayRef;
using Shape = std::vector<int64_t>;

constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kDouble = ScalarType::Double;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kHalf = ScalarType::Half;
constexpr ScalarType kLong = ScalarType::Long;
constexpr ScalarType kInt = ScalarType::Int;
constexpr ScalarType kByte = ScalarType::Byte;
constexpr ScalarType kBool = ScalarType::Bool;

// Names as torch prints them in error messages ("Float", "BFloat16", ...).
const char* dtype_name(ScalarType t);

// "cpu", "cuda:0", ...
std::string device_str(const Device& d);

// Printable shape: "[2, 3]".
struct ShapeText {
  Shape sizes;
};
inline ShapeText shape_of(const Tensor& t) {
  auto s = t.sizes();
  return {Shape(s.begin(), s.end())};
}
std::ostream& operator<<(std::ostream& os, const ShapeText& s);

namespace detail {
inline void put(std::ostringstream& os, ScalarType t) { os << dtype_name(t); }
inline void put(std::ostringstream& os, const Device& d) { os << device_str(d); }
inline void put(std::ostringstream& os, bool b) { os << (b ? "True" : "False"); }
template <typename T>
void put(std::ostringstream& os, const T& v) {
  os << v;
}
}  // namespace detail

template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (detail::put(os, args), ...);
  return os.str();
}

[[noreturn]] inline void fail(const std::string& msg) { throw std::runtime_error(msg); }

}  // namespace fk

#define FK_CHECK(cond, ...)                      \
  do {                                           \
    if (!(cond)) ::fk::fail(::fk::str(__VA_ARGS__)); \
  } while (0)

namespace fk {

inline bool same_device(const Tensor& a, const Tensor& b) { return a.device() == b.device(); }
inline bool has(const std::optional<Tensor>& t) { return t.has_value() && t->defined(); }
inline Shape sizes_vec(const Tensor& t) {
  auto s = t.sizes();
  return Shape(s.begin(), s.end());
}

namespace aten {

// Calls the operator <name>.<overload> ("aten::mul", "Tensor") with its full argument list
// (defaults included) and returns its N outputs. N must be the operator's number of
// returns: each output holds a reference that only its Tensor releases.
//
// The shim reports a failure of the called operator as an error code only (torch prints
// the operator's own message to stderr): callers check their inputs first, so that the
// mistakes fk knows of raise their own messages.
template <size_t N, typename... A>
std::array<Tensor, N> call_n(const char* name, const char* overload, const A&... args) {
  constexpr size_t n = sizeof...(A) > N ? sizeof...(A) : N;
  std::array<StableIValue, n> stack{torch::stable::detail::from(args)...};
  FK_CHECK(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION) ==
               AOTI_TORCH_SUCCESS,
           "fk: the operator ", name, (*overload ? "." : ""), overload,
           " failed (torch printed its error above)");
  std::array<Tensor, N> out;
  for (size_t i = 0; i < N; ++i) out[i] = torch::stable::detail::to<Tensor>(stack[i]);
  return out;
}
template <typename... A>
Tensor call(const char* name, const char* overload, const A&... args) {
  return call_n<1>(name, overload, args...)[0];
}

// Creation.
Tensor empty(IntArrayRef sizes, ScalarType dtype, const Device& device);
Tensor zeros(IntArrayRef sizes, ScalarType dtype, const Device& device);
Tensor full(IntArrayRef sizes, double value, ScalarType dtype, const Device& device);
Tensor empty_like(const Tensor& t);  // same sizes, dtype, device; contiguous
Tensor zeros_like(const Tensor& t);
// A 0-dim CPU tensor: a scalar operand of the arithmetic below (type promotion treats it as
// a Python scalar of its kind: float64 for doubles, int64 for integers).
Tensor scalar(double v);
Tensor scalar_int(int64_t v);

// Views and layout.
Tensor contiguous(const Tensor& t);
Tensor view(const Tensor& t, IntArrayRef sizes);
Tensor reshape(const Tensor& t, IntArrayRef sizes);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor squeeze(const Tensor& t, int64_t dim);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor t(const Tensor& t);  // 2-D transpose
Tensor movedim(const Tensor& t, int64_t src, int64_t dst);
Tensor flatten(const Tensor& t, int64_t start = 0, int64_t end = -1);
Tensor expand(const Tensor& t, IntArrayRef sizes);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);

// Copies and conversions.
Tensor to(const Tensor& t, ScalarType dtype);  // no copy when already of dtype
Tensor to(const Tensor& t, const Device& device, ScalarType dtype);
Tensor clone(const Tensor& t);  // contiguous copy
void copy_(const Tensor& dst, const Tensor& src);
void zero_(const Tensor& t);
void fill_(const Tensor& t, double v);

// Arithmetic (broadcasting, torch's type promotion).
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& a);
Tensor reciprocal(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor erf(const Tensor& a);
Tensor gelu(const Tensor& a, const std::string& approximate);
Tensor gelu_backward(const Tensor& grad, const Tensor& a, const std::string& approximate);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);
void add_(const Tensor& dst, const Tensor& b);  // dst += b
void mul_(const Tensor& dst, const Tensor& b);  // dst *= b

// Reductions.
Tensor sum(const Tensor& t, IntArrayRef dims, bool keepdim = false,
           std::optional<ScalarType> dtype = std::nullopt);
Tensor sum_all(const Tensor& t, std::optional<ScalarType> dtype = std::nullopt);
void sum_out(const Tensor& out, const Tensor& t, IntArrayRef dims, bool keepdim = false,
             std::optional<ScalarType> dtype = std::nullopt);
Tensor mean(const Tensor& t, IntArrayRef dims, bool keepdim = false);
Tensor amax(const Tensor& t, IntArrayRef dims, bool keepdim = false);
Tensor logsumexp(const Tensor& t, IntArrayRef dims, bool keepdim = false);
Tensor softmax(const Tensor& t, int64_t dim, std::optional<ScalarType> dtype = std::nullopt);

// Indexing.
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index);
void scatter_add_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src);
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index);
Tensor cat(const std::vector<Tensor>& ts, int64_t dim);
Tensor stack(const std::vector<Tensor>& ts, int64_t dim);

// Matrix products (cuBLAS on CUDA).
Tensor mm(const Tensor& a, const Tensor& b);
Tensor matmul(const Tensor& a, const Tensor& b);
void mm_out(const Tensor& out, const Tensor& a, const Tensor& b);
// out = a @ b in out's dtype (a float32 product of 16-bit inputs on CUDA).
void mm_out_dtype(const Tensor& out, const Tensor& a, const Tensor& b);
// out = a @ w^T + bias (bias broadcast over rows, or of out's shape). `bias` may be `out`
// itself: then out += a @ w^T with no copy (ATen's addmm with beta = 1 on out).
void linear_out(const Tensor& out, const Tensor& a, const Tensor& w, const Tensor& bias);

}  // namespace aten

// Tensor arithmetic for the reference kernels: tensor (op) tensor / double.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return aten::add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return aten::sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return aten::mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return aten::div(a, b); }
inline Tensor operator-(const Tensor& a) { return aten::neg(a); }
inline Tensor operator+(const Tensor& a, double b) { return aten::add(a, aten::scalar(b)); }
inline Tensor operator-(const Tensor& a, double b) { return aten::sub(a, aten::scalar(b)); }
inline Tensor operator*(const Tensor& a, double b) { return aten::mul(a, aten::scalar(b)); }
inline Tensor operator/(const Tensor& a, double b) { return aten::div(a, aten::scalar(b)); }
inline Tensor operator+(double a, const Tensor& b) { return aten::add(aten::scalar(a), b); }
inline Tensor operator-(double a, const Tensor& b) { return aten::sub(aten::scalar(a), b); }
inline Tensor operator*(double a, const Tensor& b) { return aten::mul(aten::scalar(a), b); }
inline Tensor operator/(double a, const Tensor& b) { return aten::div(aten::scalar(a), b); }

}  // namespace fk
