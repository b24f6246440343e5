// fk::fused_linear_jsd: the generalized Jensen-Shannon divergence between a student's and a
// frozen teacher's language-model heads, log_softmax(x_s @ W_s^T / T) against
// log_softmax(x_t @ W_t^T / T), without ever holding the (N, V) logits: chunks of rows go
// through ATen matmuls (cuBLAS on CUDA) into float32 logits, the divergence kernel
// (triton_src/fused_linear_jsd.py on CUDA, the reference on CPU) writes the loss rows and
// the student logits' gradient, and two more matmuls turn it into the gradients of the
// student's input and weight.
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include "runtime/tensor.h"

namespace fk::ops {

// Shared by every backend: student_input (N, H), student_weight (V, H), teacher_input
// (N, H'), teacher_weight (V, H'), all of one floating dtype and device; shift_labels (N,)
// int64; beta in [0, 1]; temperature > 0; chunk_size >= 1. python/fk/ops/fused_linear_jsd.py
// raises the same messages from the fake kernel.
void check_fused_linear_jsd(const Tensor& student_input, const Tensor& student_weight,
                            const Tensor& teacher_input, const Tensor& teacher_weight,
                            const std::optional<Tensor>& shift_labels, double beta,
                            double temperature, std::optional<int64_t> chunk_size);

// Rows per chunk of the gradient products: chunk_size if given, else as
// fused_linear_cross_entropy's (logits about the size of the student's input, at least
// 1024 rows, a multiple of 128, at most n).
int64_t fljsd_chunk_rows(int64_t n, int64_t h, int64_t v, std::optional<int64_t> chunk_size);
// Rows per step of the float32 logits inside a chunk of `rows`: the two float32 logits
// buffers together as large as the chunk's gradient buffer (elements of grad_elem bytes).
int64_t fljsd_logits_rows(int64_t rows, int64_t grad_elem);

// The divergence of m rows: s, t (m, V) float32 (float64 on CPU for float64 inputs) logits
// of the student and the teacher; writes loss_rows (m,) (each counted row's loss / den) and,
// when grad is defined, grad (m, V) = d loss / d s in grad's dtype (zero rows where
// labels[i] == ignore_index). labels: (m,) int64 or undefined; den: 0-dim, the number of
// counted rows of the whole batch.
void jsd_rows(const Tensor& s, const Tensor& t, const Tensor& grad, const Tensor& labels,
              const Tensor& den, const Tensor& loss_rows, double beta, int64_t ignore_index,
              double temperature);
void jsd_rows_cpu(const Tensor& s, const Tensor& t, const Tensor& grad, const Tensor& labels,
                  const Tensor& den, const Tensor& loss_rows, double beta,
                  int64_t ignore_index, double temperature);
void jsd_rows_cuda(const Tensor& s, const Tensor& t, const Tensor& grad, const Tensor& labels,
                   const Tensor& den, const Tensor& loss_rows, double beta,
                   int64_t ignore_index, double temperature);

// (loss, grad_student_input, grad_student_weight): a gradient only where grad_mask asks,
// for a grad_output of 1.
std::tuple<Tensor, Tensor, Tensor> fused_linear_jsd_forward_impl(
    Tensor student_input, Tensor student_weight, Tensor teacher_input, Tensor teacher_weight,
    std::optional<Tensor> shift_labels, double beta, int64_t ignore_index, double temperature,
    std::optional<int64_t> chunk_size, std::vector<bool> grad_mask);

}  // namespace fk::ops
