"""The fk forwards that replace Hugging Face ones, one per kind of module.

Each is written once for every model that has that kind of module; per-model differences come
in as arguments from the table (``_table.py``). ``_patch.py`` binds them to instances.
"""
import dataclasses
import functools
import inspect
import types

import torch
import torch.nn.functional as F

from ..ops.cross_entropy import cross_entropy
from ..ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from ..ops.geglu import geglu
from ..ops.layer_norm import layer_norm
from ..ops.rms_norm import rms_norm
from ..ops.rope import apply_rotary_pos_emb, rope
from ..ops.swiglu import swiglu
from ..nn.tiled_mlp import tiled_gated_mlp


# --- gates: (gate, up) -> act(gate) * up --------------------------------------------------

def gate_for(act, swiglu_on, geglu_on):
    """The fk gate matching the activation module ``act``, or None when fk has none (or the
    matching kind is switched off)."""
    from transformers import activations as A
    if isinstance(act, (A.SiLUActivation, torch.nn.SiLU)):
        return "swiglu" if swiglu_on else None
    if isinstance(act, (A.GELUTanh, A.NewGELUActivation)) or (
            isinstance(act, torch.nn.GELU) and act.approximate == "tanh"):
        return "geglu_tanh" if geglu_on else None
    if isinstance(act, A.GELUActivation) or (isinstance(act, torch.nn.GELU)
                                             and act.approximate == "none"):
        return "geglu_none" if geglu_on else None
    return None


def _gate(kind, a, b, in_place):
    if kind == "swiglu":
        return swiglu(a, b, backward_in_place=in_place)
    return geglu(a, b, approximate=kind[len("geglu_"):], backward_in_place=in_place)


# --- module forwards (bound to an instance: the first argument is the module) -------------

def rms_norm_forward(self, hidden_states, *, norm):
    weight = getattr(self, "weight", None)  # None: a norm without one (Llama 4's L2Norm)
    if weight is not None and weight.dtype != hidden_states.dtype:  # e.g. float32 weights
        weight = weight.to(hidden_states.dtype)                     # under autocast
    return rms_norm(hidden_states, weight, getattr(self, norm.eps_attr), norm.offset,
                    norm.casting_mode)


def layer_norm_forward(self, x):
    return layer_norm(x, self.weight, self.bias, self.eps)


def model_layer_norm_forward(self, x, *, spec):
    """A model's own LayerNorm class over the last dim (Cohere's, OLMo's): weight and bias
    where the module has them, epsilon from the table's spec."""
    weight, bias = getattr(self, "weight", None), getattr(self, "bias", None)
    if weight is not None and weight.dtype != x.dtype:  # e.g. float32 weights under autocast
        weight = weight.to(x.dtype)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    eps = getattr(self, spec.eps_attr) if spec.eps_attr else spec.eps
    return layer_norm(x, weight, bias, eps)


def _output_dropout(self, y, dropout):
    if dropout is None:
        return y
    return F.dropout(y, p=getattr(self, dropout), training=self.training)


def mlp_forward(self, x, *, gate, dropout=None, multipliers=False):
    if multipliers:  # Falcon-H1: act(gate_proj(x) * gate_multiplier), output * down_multiplier
        h = _gate(gate, self.gate_proj(x) * self.gate_multiplier, self.up_proj(x), True)
        return self.down_proj(h) * self.down_multiplier
    # The projections' outputs are read by nothing but the gate, so its backward may write
    # the gradients over them.
    y = self.down_proj(_gate(gate, self.gate_proj(x), self.up_proj(x), True))
    return _output_dropout(self, y, dropout)


def tiled_mlp_forward(self, x, *, gate, num_shards, dropout=None):
    y = tiled_gated_mlp(x, self.gate_proj.weight, self.up_proj.weight,
                        self.down_proj.weight, self.gate_proj.bias, self.up_proj.bias,
                        self.down_proj.bias, gate, num_shards)
    return _output_dropout(self, y, dropout)


def fused_mlp_forward(self, x, *, gate):
    g, u = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(_gate(gate, g, u, False))


def experts_apply_gate(self, gate_up_out, *, gate):
    g, u = gate_up_out.chunk(2, dim=-1)
    return _gate(gate, g, u, False)


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Experts with the gate through ``self._apply_gate``. Hugging Face's batched
    implementations already call it; its eager loop calls ``act_fn(gate) * up`` inline, so
    for ``experts_implementation="eager"`` this is that loop with the gate replaced."""
    if getattr(self.config, "_experts_implementation", "eager") != "eager":
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
    out = torch.zeros_like(hidden_states)
    with torch.no_grad():
        mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        e = e[0]
        if e == self.num_experts:
            continue
        pos, tok = torch.where(mask[e])
        h = self._apply_gate(F.linear(hidden_states[tok], self.gate_up_proj[e]))
        h = F.linear(h, self.down_proj[e]) * top_k_weights[tok, pos, None]
        out.index_add_(0, tok, h.to(out.dtype))
    return out


def bmm_experts_forward(self, hidden_states, *, gate):
    """Llama 4's experts: tokens already grouped per expert, ``(experts * tokens, hidden)``;
    one bmm into the stacked gate / up projection, fk's gate, one bmm out."""
    x = hidden_states.view(self.gate_up_proj.shape[0], -1, self.hidden_size)
    g, u = torch.bmm(x, self.gate_up_proj).chunk(2, dim=-1)
    return torch.bmm(_gate(gate, g, u, False), self.down_proj).view(-1, self.hidden_size)


def _interleaved_rope(q, k, cos, sin, unsqueeze_dim, half_cos):
    if half_cos:
        # cos / sin's first half, one value per rotating pair; the rotated width is theirs.
        rotary_dim = cos.shape[-1]
        cos = cos[..., :rotary_dim // 2].contiguous()
        sin = sin[..., :rotary_dim // 2].contiguous()
    else:
        rotary_dim = None
    if unsqueeze_dim == 1:
        return rope(q, k, cos, sin, rotary_dim, True)
    if unsqueeze_dim == 2:
        q_out, k_out = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, rotary_dim, True)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise ValueError(f"fk.apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")


def apply_rotary_pos_emb_interleaved(q, k, cos, sin, unsqueeze_dim=1):
    """Cohere's ``apply_rotary_pos_emb``: pairs ``(x[2i], x[2i+1])`` rotate, cos / sin hold
    each pair's value twice (``repeat_interleave``); float32 math, rounded once."""
    return _interleaved_rope(q, k, cos, sin, unsqueeze_dim, False)


def apply_rotary_pos_emb_glm(q, k, cos, sin, unsqueeze_dim=1):
    """GLM's (and ERNIE 4.5's) ``apply_rotary_pos_emb``: pair ``i`` is ``(x[2i], x[2i+1])``
    and turns by angle ``i`` of the first half of cos / sin (Llama-layout tables); the first
    ``cos.shape[-1]`` dims of each head rotate, the rest pass through."""
    return _interleaved_rope(q, k, cos, sin, unsqueeze_dim, True)


def apply_rotary_pos_emb_pair(q, k, cos, sin, unsqueeze_dim=1):
    """GPT-OSS's ``apply_rotary_pos_emb``: rotate-half (``x[i]`` with ``x[i + D/2]``) with
    cos / sin holding one value per pair (width ``D / 2``)."""
    rotary_dim = 2 * cos.shape[-1]
    if unsqueeze_dim == 1:
        return rope(q, k, cos, sin, rotary_dim)
    if unsqueeze_dim == 2:
        q_out, k_out = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, rotary_dim)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise ValueError(f"fk.apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")


def apply_rotary_pos_emb_deinterleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """DeepSeek-V3's ``apply_rotary_pos_emb_interleave``: pairs ``(x[2i], x[2i+1])`` turn by
    the angle of cos / sin's first half and come out de-interleaved (the even dims' results,
    then the odd dims'): the rotate-half rotation of ``cat(x[0::2], x[1::2])``."""
    q = torch.cat((q[..., 0::2], q[..., 1::2]), dim=-1)
    k = torch.cat((k[..., 0::2], k[..., 1::2]), dim=-1)
    return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)


def _llama4_apply_rotary_emb(xq, xk, freqs_cis):
    from ..ops.llama4_rope import apply_rotary_emb
    return apply_rotary_emb(xq, xk, freqs_cis)


# Per rope style: the names in the attention's module that resolve to fk's functions.
ROPES = {"half": {"apply_rotary_pos_emb": apply_rotary_pos_emb},
         "interleaved": {"apply_rotary_pos_emb": apply_rotary_pos_emb_interleaved},
         "glm": {"apply_rotary_pos_emb": apply_rotary_pos_emb_glm},
         "pair": {"apply_rotary_pos_emb": apply_rotary_pos_emb_pair},
         "deepseek": {"apply_rotary_pos_emb": apply_rotary_pos_emb,
                      "apply_rotary_pos_emb_interleave": apply_rotary_pos_emb_deinterleave},
         "llama4": {"apply_rotary_emb": _llama4_apply_rotary_emb}}


@functools.lru_cache(maxsize=None)
def rope_forward(cls, style="half"):
    """``cls.forward`` with the name ``apply_rotary_pos_emb`` (or the style's others) resolving
    to fk's (of the model's ``style``: see ``ROPES``): the same code object, run against a
    copy of its module's globals. The class is left untouched."""
    f = cls.forward
    scope = dict(f.__globals__, **ROPES[style])
    g = types.FunctionType(f.__code__, scope, f.__name__, f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    g.__qualname__, g.__doc__, g.__module__ = f.__qualname__, f.__doc__, f.__module__
    return g


# --- losses -------------------------------------------------------------------------------

def _shifted(labels, ignore_index, shift_labels):
    if shift_labels is None:  # position i predicts token i + 1; the last predicts nothing
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels.reshape(-1)


def _normalize(loss, num_items_in_batch):
    if num_items_in_batch is None:
        return loss
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                   shift_labels=None, **kwargs):
    """Hugging Face's ``ForCausalLMLoss`` on fk's cross entropy: shifted labels,
    ``ignore_index``, a sum divided by ``num_items_in_batch`` when given, else the mean. The
    logits are returned to the caller too, so the gradient gets its own buffer. The loss is
    float32, as Hugging Face's (which upcasts the logits to float32 first).
    ``num_items_in_batch`` is the op's mean_denominator: the division happens in the kernel,
    so the loss's gradient needs no scaling pass over the logits in the backward."""
    target = _shifted(labels, ignore_index, shift_labels).to(logits.device)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(logits.device)
    return cross_entropy(logits.reshape(-1, vocab_size), target, ignore_index=ignore_index,
                         reduction="mean", grad_in_logits=False, loss_dtype=torch.float32,
                         mean_denominator=num_items_in_batch)


def linear_causal_lm_loss(hidden, lm_head, labels, *, scale=None, softcap=None,
                          num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                          multiplier=None):
    """The same loss from the hidden states, through fk's fused linear cross entropy: the
    ``(tokens, vocab)`` logits are never built. Logits divided by ``scale`` (Granite) or
    multiplied by ``multiplier`` (Cohere): the hidden states are, before the head (the head
    being linear with no bias in those models, the logits are the same)."""
    x = hidden.reshape(-1, hidden.shape[-1])
    if scale is not None:
        x = x / scale
    if multiplier is not None:
        x = x * multiplier
    weight, bias = lm_head.weight, lm_head.bias
    _check_full_weight(weight)
    device = x.device.type
    if torch.is_autocast_enabled(device):  # the head's matmul would have run in this dtype
        dtype = torch.get_autocast_dtype(device)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    elif x.dtype != weight.dtype:
        x = x.to(weight.dtype)
    target = _shifted(labels, ignore_index, shift_labels).to(x.device)
    loss = fused_linear_cross_entropy(
        x, weight, target, bias, ignore_index=ignore_index, softcap=softcap,
        reduction="mean" if num_items_in_batch is None else "sum", loss_dtype=torch.float32)
    return _normalize(loss, num_items_in_batch)


def _check_full_weight(weight):
    """The fused loss reads the head's whole (vocab, hidden) weight. Under FSDP2 the head's
    call gathers it (see ``lm_head_forward``); a weight still distributed at this point
    (tensor parallel, or a head sharded by something that did not gather it) is refused."""
    if isinstance(weight, torch.Tensor) and type(weight) is not torch.Tensor and \
            torch.distributed.is_available():
        from torch.distributed.tensor import DTensor
        if isinstance(weight, DTensor):
            raise NotImplementedError(
                "fk.transformers: the fused linear cross entropy needs the full lm_head "
                f"weight, but lm_head.weight is a DTensor with placements {weight.placements} "
                "(tensor-parallel or otherwise distributed outside the head's own call). "
                "Patch with apply_fk(model, fused_linear_cross_entropy=False) for such heads.")


def lm_head_forward(self, x, labels=None, **loss):
    """The forward given to the head (an ``nn.Linear``) of a patched causal LM: its own
    without ``labels``; with them, the loss through ``linear_causal_lm_loss`` (keywords as
    that function's). The loss runs inside the head's call, so hooks on the head run around
    it as around its matmul: with ``fully_shard(lm_head)`` (FSDP2) the full weight is
    gathered before, the gradient of the gathered weight reduce-scattered to the shards in
    the backward, and the weight resharded after."""
    if labels is None:
        return type(self).forward(self, x)
    return linear_causal_lm_loss(x, self, labels, **loss)


def _head_loss(head, hidden, labels, **loss):
    """The loss through the head's call where the head carries ``lm_head_forward`` (set by
    apply_fk); a head put in its place afterwards is read directly."""
    if getattr(head.__dict__.get("forward"), "__func__", None) is lm_head_forward:
        # labels by keyword: forward pre-hooks without kwargs (tensor parallel's) may replace
        # the positional arguments with the first one alone.
        out = head(hidden, labels=labels, **loss)
        if out.dim() != 0:  # never take logits for a loss
            raise RuntimeError(
                "fk.transformers: lm_head's call returned a tensor of shape "
                f"{tuple(out.shape)} instead of the loss: a hook on lm_head dropped the labels "
                "argument. Patch with apply_fk(model, fused_linear_cross_entropy=False) there.")
        return out
    return linear_causal_lm_loss(hidden, head, labels, **loss)


def causal_lm_forward(self, *args, spec, modeling, **kwargs):
    """``...ForCausalLM.forward`` (or a vision-language ``...ForConditionalGeneration``'s,
    whose image and video inputs pass through to the base model): in training with labels,
    the loss comes from the hidden states through ``linear_causal_lm_loss`` and ``logits`` is
    None; otherwise the model's own forward runs (logits as before; its loss through
    ``self.loss_function``)."""
    original = type(self).forward
    if args:  # positional arguments, named as the original names them
        names = list(_parameters(original))[1:]
        kwargs.update(zip(names, args))
    if kwargs.get("labels") is None or not self.training:
        return original(self, **kwargs)
    return _training_forward(self, spec=spec, modeling=modeling, **kwargs)


@functools.lru_cache(maxsize=None)
def _parameters(f):
    return tuple(inspect.signature(f).parameters)


def _logit_multiplier(model, spec):
    if spec.logit_scale:
        return model.logit_scale
    if spec.logit_multiplier is not None:
        return functools.reduce(getattr, spec.logit_multiplier.split("."), model)
    return None


def _training_forward(self, input_ids=None, attention_mask=None, position_ids=None,
                      past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
                      logits_to_keep=0, output_router_logits=None, return_dict=None, *,
                      spec, modeling, **kwargs):
    from transformers.modeling_outputs import CausalLMOutputWithPast, MoeCausalLMOutputWithPast
    config = self.config
    extra = {}
    if spec.output is not None:  # a vision-language model: HF passes these only when given
        if use_cache is not None:
            extra["use_cache"] = use_cache
        if spec.moe and output_router_logits is not None:
            extra["output_router_logits"] = output_router_logits
        output_router_logits = bool(output_router_logits)
    else:
        extra["use_cache"] = use_cache
        if spec.moe:
            if output_router_logits is None:
                output_router_logits = config.output_router_logits
            extra["output_router_logits"] = output_router_logits
    if spec.labels_to_base:
        extra["labels"] = labels
    base = getattr(self, self.base_model_prefix, None)
    if base is None:  # Llama 4's causal LM keeps its text model in .model
        base = self.model
    outputs = base(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        past_key_values=past_key_values, inputs_embeds=inputs_embeds, **extra, **kwargs)
    hidden = outputs.last_hidden_state
    keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    loss = _head_loss(
        self.lm_head, hidden[:, keep, :], labels,
        scale=config.logits_scaling if spec.logits_scaling else None,
        softcap=config.final_logit_softcapping if spec.softcap else None,
        multiplier=_logit_multiplier(self, spec),
        num_items_in_batch=kwargs.get("num_items_in_batch"),
        ignore_index=kwargs.get("ignore_index", -100), shift_labels=kwargs.get("shift_labels"))
    common = dict(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)
    if spec.moe:
        aux_loss = None
        if output_router_logits:
            if spec.output is not None:
                text = config.text_config
                num_experts, top_k, coef = (text.num_experts, text.num_experts_per_tok,
                                            text.router_aux_loss_coef)
            else:
                num_experts, top_k, coef = (self.num_experts, self.num_experts_per_tok,
                                            self.router_aux_loss_coef)
            aux_loss = modeling.load_balancing_loss_func(
                outputs.router_logits, num_experts, top_k, attention_mask)
            loss = loss + coef * aux_loss.to(loss.device)
        common.update(loss=loss, aux_loss=aux_loss, router_logits=outputs.router_logits)
    if spec.output is not None:  # with the base model's other outputs (rope_deltas, ...)
        cls = getattr(modeling, spec.output)
        more = {f.name: getattr(outputs, f.name, None) for f in dataclasses.fields(cls)
                if f.name not in common}
        out = cls(**common, **more)
    elif spec.moe:
        out = MoeCausalLMOutputWithPast(**common)
    else:
        out = CausalLMOutputWithPast(**common)
    if return_dict is None:
        return_dict = config.return_dict
    return out if return_dict else out.to_tuple()
