"""``liger_kernel.transformers.rope.liger_rotary_pos_emb`` on ``fk.rope``."""
from ...ops.rope import rope


def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
    """Rotate-half RoPE of q ``(B, Hq, S, D)`` and k ``(B, Hk, S, D)`` (``unsqueeze_dim=1``;
    ``(B, S, H, D)`` with ``unsqueeze_dim=2``) by cos / sin of shape ``(1 or B, S, D)``
    (a size-1 dim at ``unsqueeze_dim`` is dropped). ``position_ids`` is unused, as in
    Liger and Hugging Face. ``rotary_dim``: the rotated leading entries of each head."""
    if cos.dim() == 4 and cos.shape[unsqueeze_dim] == 1:
        cos, sin = cos.squeeze(unsqueeze_dim), sin.squeeze(unsqueeze_dim)
    if unsqueeze_dim == 1:
        return rope(q, k, cos, sin, rotary_dim)
    if unsqueeze_dim == 2:
        q_out, k_out = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, rotary_dim)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    raise NotImplementedError(f"liger_rotary_pos_emb: unsqueeze_dim={unsqueeze_dim!r} is not "
                              "supported by fk (1 or 2)")


__all__ = ["liger_rotary_pos_emb"]
