"""Liger Kernel's modules (``liger_kernel.transformers.Liger*``) on fk's ops: the same
constructor arguments, defaults, parameter names and forward signatures."""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ...ops.cross_entropy import cross_entropy
from ...ops.dyt import dyt
from ...ops.fused_add_rms_norm import fused_add_rms_norm
from ...ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from ...ops.fused_linear_jsd import fused_linear_jsd
from ...ops.geglu import geglu
from ...ops.jsd import jsd
from ...ops.kl_div import kl_div
from ...ops.layer_norm import layer_norm
from ...ops.poly_norm import poly_norm
from ...ops.rms_norm import rms_norm
from ...ops.softmax import softmax
from ...ops.sparsemax import sparsemax
from ...ops.swiglu import swiglu
from ...ops.tvd import tvd


def unsupported(where: str, **options):
    """Raise NotImplementedError naming the options (given as name=value pairs that differ
    from what fk supports)."""
    names = ", ".join(f"{k}={v!r}" for k, v in options.items())
    raise NotImplementedError(f"{where}: {names} is not supported by fk")


def like(w: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
    """A parameter in the input's dtype (float32 weights under autocast meet 16-bit
    activations; Liger's kernels then return the input's dtype, and so does fk)."""
    return w if w is None or w.dtype == x.dtype else w.to(x.dtype)


def _init(hidden_size, init_fn):
    if init_fn not in ("ones", "zeros"):
        raise ValueError(f"init_fn must be either 'ones' or 'zeros', got {init_fn}")
    return torch.ones(hidden_size) if init_fn == "ones" else torch.zeros(hidden_size)


@dataclass
class CrossEntropyOutput:
    """What Liger's cross entropy losses return when an extra output is asked for."""
    loss: torch.Tensor
    z_loss: Optional[torch.Tensor] = None
    token_accuracy: Optional[torch.Tensor] = None
    predicted_tokens: Optional[torch.Tensor] = None


def ce_result(out, return_z_loss, return_token_accuracy, return_predicted_tokens):
    """Liger's return value from what fk's cross entropy returned for the same request: the
    loss alone, else a CrossEntropyOutput. Liger marks an ignored row's predicted token -1
    where fk writes -100 (every other prediction is a class index, at least 0)."""
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        return out
    if return_token_accuracy or return_predicted_tokens:
        loss, z_loss, token_accuracy, predicted_tokens = out
    else:
        (loss, z_loss), token_accuracy, predicted_tokens = out, None, None
    if predicted_tokens is not None:
        predicted_tokens = predicted_tokens.clamp(min=-1)
    return CrossEntropyOutput(loss=loss, z_loss=z_loss, token_accuracy=token_accuracy,
                              predicted_tokens=predicted_tokens)


class LigerRMSNorm(nn.Module):
    """RMSNorm (``fk.rms_norm``). ``in_place`` and ``row_mode`` pick Liger's backward
    tactics and kernel variants; they do not change results and are kept as attributes."""

    def __init__(self, hidden_size, eps=1e-6, offset=0.0, casting_mode="llama", init_fn="ones",
                 in_place=True, row_mode=None, elementwise_affine=True):
        super().__init__()
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(_init(hidden_size, init_fn))
        else:
            self.register_parameter("weight", None)
        self.variance_epsilon, self.offset, self.casting_mode = eps, offset, casting_mode
        self.in_place, self.row_mode = in_place, row_mode

    def forward(self, hidden_states):
        return rms_norm(hidden_states, like(self.weight, hidden_states), self.variance_epsilon,
                        self.offset, self.casting_mode)

    def extra_repr(self):
        shape = tuple(self.weight.shape) if self.weight is not None else None
        return (f"weight_shape={shape}, eps={self.variance_epsilon}, offset={self.offset}, "
                f"in_place={self.in_place}, row_mode={self.row_mode}")


class LigerRMSNormForGemma(LigerRMSNorm):
    def __init__(self, hidden_size, eps=1e-6, offset=1.0, casting_mode="gemma", init_fn="zeros",
                 in_place=True, row_mode=None):
        super().__init__(hidden_size, eps, offset, casting_mode, init_fn, in_place, row_mode)


class LigerFusedAddRMSNorm(nn.Module):
    """``(rms_norm(x + residual), x + residual)`` (``fk.fused_add_rms_norm``)."""

    def __init__(self, hidden_size, eps=1e-6, offset=0.0, casting_mode="llama", init_fn="ones",
                 in_place=False):
        super().__init__()
        self.weight = nn.Parameter(_init(hidden_size, init_fn))
        self.variance_epsilon, self.offset, self.casting_mode = eps, offset, casting_mode
        self.in_place = in_place

    def forward(self, hidden_states, residual):
        return fused_add_rms_norm(hidden_states, residual, like(self.weight, hidden_states),
                                  self.variance_epsilon, self.offset, self.casting_mode)

    def extra_repr(self):
        return (f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, offset={self.offset}, "
                f"in_place={self.in_place}")


class LigerLayerNorm(nn.Module):
    """LayerNorm (``fk.layer_norm``). As Liger's: ``eps=1e-6``, and a bias parameter always
    exists (zeros, trainable, with ``bias=False``; random normal with ``bias=True``).
    ``impl`` / ``mode`` / ``backend`` choose among Liger's own kernels: only None."""

    def __init__(self, hidden_size, eps=1e-6, bias=False, init_fn="ones", impl=None, mode=None,
                 backend=None):
        super().__init__()
        for name, value in (("impl", impl), ("mode", mode), ("backend", backend)):
            if value is not None:
                unsupported("LigerLayerNorm", **{name: value})
        self.hidden_size = hidden_size
        self.eps = self.variance_epsilon = eps
        self.weight = nn.Parameter(_init(hidden_size, init_fn))
        self.bias = nn.Parameter(torch.randn(hidden_size) if bias else torch.zeros(hidden_size))
        self.impl, self.mode = None, None

    def forward(self, hidden_states):
        return layer_norm(hidden_states, like(self.weight, hidden_states),
                          like(self.bias, hidden_states), self.variance_epsilon)

    def extra_repr(self):
        return f"{self.hidden_size}, eps={self.eps}, impl=None, mode=None"


def _check_act(config, allowed, cls):
    act = getattr(config, "hidden_act", None)
    if act not in allowed:
        raise ValueError(f"{cls}: activation function {act} not supported.")


class LigerSwiGLUMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` with the gate in ``fk.swiglu`` (its
    backward writes the gradients over the two projections' outputs, as Liger's does)."""

    def __init__(self, config, intermediate_size=None):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.intermediate_size = (intermediate_size if intermediate_size is not None
                                  else config.intermediate_size)
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)
        _check_act(config, ("silu", "swish"), "LigerSwiGLUMLP")

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), backward_in_place=True))


class LigerGEGLUMLP(nn.Module):
    """``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))`` with the gate in ``fk.geglu``:
    the tanh GELU whatever ``config.hidden_act`` says, as Liger's."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(geglu(self.gate_proj(x), self.up_proj(x), approximate="tanh",
                                    backward_in_place=True))


class LigerCrossEntropyLoss(nn.Module):
    """Cross entropy over ``(BT, V)`` logits (``fk.cross_entropy``; its gradient is written
    into the logits' memory, as Liger's is). With ``return_z_loss``,
    ``return_token_accuracy`` or ``return_predicted_tokens``: a :class:`CrossEntropyOutput`."""

    def __init__(self, weight=None, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0,
                 reduction="mean", softcap=None, return_z_loss=False,
                 return_token_accuracy=False, return_predicted_tokens=False):
        super().__init__()
        self.weight, self.ignore_index = weight, ignore_index
        self.lse_square_scale, self.label_smoothing = lse_square_scale, label_smoothing
        self.reduction, self.softcap, self.return_z_loss = reduction, softcap, return_z_loss
        self.return_token_accuracy = return_token_accuracy
        self.return_predicted_tokens = return_predicted_tokens

    def forward(self, _input, target):
        out = cross_entropy(_input, target, self.weight, self.ignore_index, self.label_smoothing,
                            self.reduction, self.lse_square_scale, self.softcap,
                            self.return_z_loss,
                            return_token_accuracy=self.return_token_accuracy,
                            return_predicted_tokens=self.return_predicted_tokens)
        return ce_result(out, self.return_z_loss, self.return_token_accuracy,
                         self.return_predicted_tokens)


class LigerFusedLinearCrossEntropyLoss(nn.Module):
    """The head's matmul and cross entropy without the logits
    (``fk.fused_linear_cross_entropy``). ``forward(lin_weight, _input, target, bias=None)``."""

    def __init__(self, ce_weight=None, ignore_index=-100, lse_square_scale=0.0,
                 label_smoothing=0.0, reduction="mean", softcap=None, return_z_loss=False,
                 accum_dtype=None, use_token_scaling=False, return_token_accuracy=False,
                 return_predicted_tokens=False):
        super().__init__()
        self.ce_weight, self.ignore_index = ce_weight, ignore_index
        self.lse_square_scale, self.label_smoothing = lse_square_scale, label_smoothing
        self.reduction, self.softcap, self.return_z_loss = reduction, softcap, return_z_loss
        self.accum_dtype, self.use_token_scaling = accum_dtype, use_token_scaling
        self.return_token_accuracy = return_token_accuracy
        self.return_predicted_tokens = return_predicted_tokens

    def forward(self, lin_weight, _input, target, bias=None):
        out = fused_linear_cross_entropy(
            _input, lin_weight, target, bias, self.ce_weight, self.ignore_index,
            self.label_smoothing, self.reduction, self.lse_square_scale, self.softcap,
            self.return_z_loss, accum_dtype=self.accum_dtype,
            loss_dtype=torch.float32,  # Liger's loss is float32
            use_token_scaling=self.use_token_scaling,
            return_token_accuracy=self.return_token_accuracy,
            return_predicted_tokens=self.return_predicted_tokens)
        return ce_result(out, self.return_z_loss, self.return_token_accuracy,
                         self.return_predicted_tokens)


class LigerSoftmax(nn.Module):
    """Softmax over the last dimension (``fk.softmax``)."""

    def forward(self, x):
        return softmax(x)


class LigerSparsemax(nn.Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return sparsemax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LigerJSD(nn.Module):
    """Generalized JSD of log-probabilities (``fk.jsd``): ``forward(log_q, log_p,
    shift_labels=None)``, ``log_q`` the student's."""

    def __init__(self, beta: float = 0.5, ignore_index: int = -100):
        super().__init__()
        self.beta, self.ignore_index = beta, ignore_index

    def forward(self, log_q, log_p, shift_labels=None):
        return jsd(log_q, log_p, shift_labels, self.beta, self.ignore_index)


class LigerKLDIVLoss(nn.KLDivLoss):
    """``torch.nn.KLDivLoss`` (its arguments; reduction "mean" by default) with Liger's
    ``eps`` (``fk.kl_div``)."""

    def __init__(self, eps: float = 1e-10, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, y_pred, y_true):
        return kl_div(y_pred, y_true, self.reduction, self.log_target, self.eps)


class LigerTVDLoss(nn.Module):
    def __init__(self, reduction="batchmean", ignore_index: int = -100):
        super().__init__()
        self.reduction, self.ignore_index = reduction, ignore_index

    def forward(self, p, q, shift_labels=None):
        return tvd(p, q, shift_labels, self.reduction, self.ignore_index)


def check_jsd_accum_dtype(where, accum_dtype, weight):
    # fk sums grad_student_weight in the weight's dtype.
    if accum_dtype is not None and accum_dtype != weight.dtype:
        unsupported(where, accum_dtype=accum_dtype)


class LigerFusedLinearJSD(nn.Module):
    """JSD between two heads' outputs without their logits (``fk.fused_linear_jsd``).
    ``accum_dtype`` other than None or the student weight's dtype raises."""

    def __init__(self, jsd_beta=0.5, ignore_index=-100, temperature=1.0, accum_dtype=None):
        super().__init__()
        if temperature == 0:
            raise ValueError("temperature cannot be 0.")
        self.jsd_beta, self.ignore_index = jsd_beta, ignore_index
        self.temperature, self.accum_dtype = temperature, accum_dtype

    def forward(self, student_input, student_weight, teacher_input, teacher_weight,
                shift_labels=None):
        check_jsd_accum_dtype("LigerFusedLinearJSD", self.accum_dtype, student_weight)
        return fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight,
                                shift_labels, self.jsd_beta, self.ignore_index, self.temperature)


class LigerDyT(nn.Module):
    """``gamma * tanh(alpha * x) + beta`` (``fk.dyt``)."""

    def __init__(self, hidden_size, beta=True, init_alpha=0.5):
        super().__init__()
        self.hidden_size, self.init_alpha = hidden_size, init_alpha
        self.alpha = nn.Parameter(torch.ones(1) * init_alpha)
        self.gamma = nn.Parameter(torch.ones(hidden_size))
        self.beta = nn.Parameter(torch.zeros(hidden_size)) if beta else None

    def forward(self, x):
        return dyt(x, self.alpha, self.gamma, self.beta)

    def extra_repr(self):
        return f"{self.hidden_size}, init_alpha={self.init_alpha}, beta={self.beta}"


class LigerPolyNorm(nn.Module):
    """PolyNorm (``fk.poly_norm``): weight ``(1/3, 1/3, 1/3)``, bias 1."""

    def __init__(self, eps=1e-6, in_place=True):
        super().__init__()
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3.0))
        self.bias = nn.Parameter(torch.tensor(1.0))
        self.variance_epsilon, self.in_place = eps, in_place

    def forward(self, hidden_states):
        return poly_norm(hidden_states, self.weight, self.bias, self.variance_epsilon)

    def extra_repr(self):
        return (f"weight_shape={tuple(self.weight.shape)}, eps={self.variance_epsilon}, "
                f"in_place={self.in_place}")
