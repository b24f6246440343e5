// fk::aten: the ATen operators fk calls, by name through the stable dispatcher shim.
#include "runtime/tensor.h"

namespace fk {

const char* dtype_name(ScalarType t) { return torch::headeronly::toString(t); }

std::string device_str(const Device& d) {
  switch (d.type()) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda:" + std::to_string(d.index());
    case DeviceType::Meta: return "meta";
    default: return "device(type " + std::to_string(static_cast<int>(d.type())) + ")";
  }
}

std::ostream& operator<<(std::ostream& os, const ShapeText& s) {
  os << "[";
  for (size_t i = 0; i < s.sizes.size(); ++i) os << (i ? ", " : "") << s.sizes[i];
  return os << "]";
}

namespace aten {

namespace st = torch::stable;
using torch::headeronly::MemoryFormat;
using OptDtype = std::optional<ScalarType>;
using OptLayout = std::optional<torch::headeronly::Layout>;
using OptDevice = std::optional<Device>;
using OptBool = std::optional<bool>;
using OptFormat = std::optional<MemoryFormat>;
constexpr auto none = std::nullopt;

namespace {

// Row-major strides of a contiguous tensor of `sizes` (a size-0 dim counts as 1, as torch's).
Shape contiguous_strides(IntArrayRef sizes) {
  Shape strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
  return strides;
}

}  // namespace

// empty and the contiguous view below call the C shim directly rather than the dispatcher:
// they run several times in every CUDA launch, where boxing their arguments through
// torch_call_dispatcher costs more host time than the launch itself.
Tensor empty(IntArrayRef sizes, ScalarType dtype, const Device& device) {
  const Shape strides = contiguous_strides(sizes);
  const auto shim_dtype = st::detail::to<int32_t>(st::detail::from(dtype));
  const auto shim_device = st::detail::to<int32_t>(st::detail::from(device.type()));
  AtenTensorHandle h = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()),
                                                  sizes.data(), strides.data(), shim_dtype,
                                                  shim_device, device.index(), &h));
  return Tensor(h);
}
Tensor zeros(IntArrayRef sizes, ScalarType dtype, const Device& device) {
  return call("aten::zeros", "", sizes, OptDtype(dtype), OptLayout(), OptDevice(device),
              OptBool());
}
Tensor full(IntArrayRef sizes, double value, ScalarType dtype, const Device& device) {
  return st::full(sizes, value, dtype, none, device);
}
Tensor empty_like(const Tensor& t) {
  return call("aten::empty_like", "", t, OptDtype(), OptLayout(), OptDevice(), OptBool(),
              OptFormat(MemoryFormat::Contiguous));
}
Tensor zeros_like(const Tensor& t) {
  return call("aten::zeros_like", "", t, OptDtype(), OptLayout(), OptDevice(), OptBool(),
              OptFormat(MemoryFormat::Contiguous));
}
Tensor scalar(double v) { return st::full({}, v, kDouble, none, Device(DeviceType::CPU)); }
Tensor scalar_int(int64_t v) {
  return st::full({}, static_cast<double>(v), kLong, none, Device(DeviceType::CPU));
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : st::contiguous(t); }
Tensor view(const Tensor& t, IntArrayRef sizes) {
  // A contiguous tensor's view of other (fully given) sizes is the same memory with
  // contiguous strides; anything else (-1 sizes, strided tensors) goes to aten::view.
  int64_t numel = 1;
  for (int64_t s : sizes) numel = s < 0 ? -1 : numel * s;
  if (numel != t.numel() || !t.is_contiguous()) return st::view(t, sizes);
  const Shape strides = contiguous_strides(sizes);
  AtenTensorHandle h = nullptr;
  // The shim's offset argument is added to t's own storage offset (torch's
  // _reinterpret_tensor takes an offset increment): 0 keeps the view at t's first element.
  TORCH_ERROR_CODE_CHECK(aoti_torch__reinterpret_tensor(t.get(),
                                                        static_cast<int64_t>(sizes.size()),
                                                        sizes.data(), strides.data(),
                                                        /*offset_increment=*/0, &h));
  return Tensor(h);
}
Tensor reshape(const Tensor& t, IntArrayRef sizes) { return st::reshape(t, sizes); }
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  Tensor self = t;
  return st::narrow(self, dim, start, length);
}
Tensor unsqueeze(const Tensor& t, int64_t dim) { return st::unsqueeze(t, dim); }
Tensor squeeze(const Tensor& t, int64_t dim) { return st::squeeze(t, dim); }
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) { return st::transpose(t, d0, d1); }
Tensor t(const Tensor& x) { return st::transpose(x, 0, 1); }
Tensor movedim(const Tensor& t, int64_t src, int64_t dst) {
  return call("aten::movedim", "int", t, src, dst);
}
Tensor flatten(const Tensor& t, int64_t start, int64_t end) { return st::flatten(t, start, end); }
Tensor expand(const Tensor& t, IntArrayRef sizes) {
  return call("aten::expand", "", t, sizes, false);
}
Tensor select(const Tensor& t, int64_t dim, int64_t index) { return st::select(t, dim, index); }
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return call("aten::slice", "Tensor", t, dim, std::optional<int64_t>(start),
              std::optional<int64_t>(end), step);
}

Tensor to(const Tensor& t, ScalarType dtype) {
  if (t.scalar_type() == dtype) return t;
  return st::to(t, dtype);
}
Tensor to(const Tensor& t, const Device& device, ScalarType dtype) {
  return st::to(t, dtype, none, device);
}
Tensor clone(const Tensor& t) {
  return call("aten::clone", "", t, OptFormat(MemoryFormat::Contiguous));
}
void copy_(const Tensor& dst, const Tensor& src) {
  Tensor d = dst;
  st::copy_(d, src);
}
void zero_(const Tensor& t) {
  Tensor d = t;
  st::zero_(d);
}
void fill_(const Tensor& t, double v) { st::fill_(t, v); }

Tensor add(const Tensor& a, const Tensor& b) { return st::subtract(a, b, -1.0); }
Tensor sub(const Tensor& a, const Tensor& b) { return st::subtract(a, b, 1.0); }
Tensor mul(const Tensor& a, const Tensor& b) { return call("aten::mul", "Tensor", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return call("aten::div", "Tensor", a, b); }
Tensor neg(const Tensor& a) { return call("aten::neg", "", a); }
Tensor reciprocal(const Tensor& a) { return call("aten::reciprocal", "", a); }
Tensor rsqrt(const Tensor& a) { return call("aten::rsqrt", "", a); }
Tensor sqrt(const Tensor& a) { return call("aten::sqrt", "", a); }
Tensor exp(const Tensor& a) { return call("aten::exp", "", a); }
Tensor log(const Tensor& a) { return call("aten::log", "", a); }
Tensor tanh(const Tensor& a) { return call("aten::tanh", "", a); }
Tensor sigmoid(const Tensor& a) { return call("aten::sigmoid", "", a); }
Tensor erf(const Tensor& a) { return call("aten::erf", "", a); }
Tensor gelu(const Tensor& a, const std::string& approximate) {
  return call("aten::gelu", "", a, approximate);
}
Tensor gelu_backward(const Tensor& grad, const Tensor& a, const std::string& approximate) {
  return call("aten::gelu_backward", "", grad, a, approximate);
}
Tensor maximum(const Tensor& a, const Tensor& b) { return call("aten::maximum", "", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return call("aten::minimum", "", a, b); }
Tensor where(const Tensor& c, const Tensor& a, const Tensor& b) {
  return call("aten::where", "self", c, a, b);
}
Tensor eq(const Tensor& a, const Tensor& b) { return call("aten::eq", "Tensor", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return call("aten::ne", "Tensor", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return call("aten::lt", "Tensor", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return call("aten::ge", "Tensor", a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return call("aten::logical_and", "", a, b);
}
Tensor logical_not(const Tensor& a) { return call("aten::logical_not", "", a); }
void add_(const Tensor& dst, const Tensor& b) { copy_(dst, add(dst, b)); }
void mul_(const Tensor& dst, const Tensor& b) { (void)call("aten::mul_", "Tensor", dst, b); }

Tensor sum(const Tensor& t, IntArrayRef dims, bool keepdim, std::optional<ScalarType> dtype) {
  return st::sum(t, dims, keepdim, dtype);
}
Tensor sum_all(const Tensor& t, std::optional<ScalarType> dtype) {
  return call("aten::sum", "", t, dtype);
}
void sum_out(const Tensor& out, const Tensor& t, IntArrayRef dims, bool keepdim,
             std::optional<ScalarType> dtype) {
  Tensor o = out;
  st::sum_out(o, t, dims, keepdim, dtype);
}
Tensor mean(const Tensor& t, IntArrayRef dims, bool keepdim) {
  return call("aten::mean", "dim", t, std::optional<IntArrayRef>(dims), keepdim, OptDtype());
}
Tensor amax(const Tensor& t, IntArrayRef dims, bool keepdim) {
  return call("aten::amax", "", t, dims, keepdim);
}
Tensor logsumexp(const Tensor& t, IntArrayRef dims, bool keepdim) {
  return call("aten::logsumexp", "", t, dims, keepdim);
}
Tensor softmax(const Tensor& t, int64_t dim, std::optional<ScalarType> dtype) {
  return call("aten::softmax", "int", t, dim, dtype);
}

Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  return call("aten::gather", "", t, dim, index, false);
}
void scatter_add_(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src) {
  (void)call("aten::scatter_add_", "", dst, dim, index, src);
}
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index) {
  return call("aten::index_select", "", t, dim, index);
}
Tensor cat(const std::vector<Tensor>& ts, int64_t dim) { return call("aten::cat", "", ts, dim); }
Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  return call("aten::stack", "", ts, dim);
}

Tensor mm(const Tensor& a, const Tensor& b) { return call("aten::mm", "", a, b); }
Tensor matmul(const Tensor& a, const Tensor& b) { return st::matmul(a, b); }
void mm_out(const Tensor& out, const Tensor& a, const Tensor& b) {
  (void)call("aten::mm", "out", a, b, out);
}
void mm_out_dtype(const Tensor& out, const Tensor& a, const Tensor& b) {
  (void)call("aten::mm", "dtype_out", a, b, out.scalar_type(), out);
}
void linear_out(const Tensor& out, const Tensor& a, const Tensor& w, const Tensor& bias) {
  (void)call("aten::linear", "out", a, w, std::optional<Tensor>(bias), out);
}

}  // namespace aten
}  // namespace fk
