"""A BERT encoder run padding-free: activations [tokens, width] for a whole packed batch, with the model's own modules.

Every dense part (embeddings, Q/K/V, the attention output, the FFN, LayerNorms) runs on the packed tokens, so it
computes no padding at all. Attention is the one part that needs each text apart:
- "varlen" (CUDA, fp16/bf16): FlashAttention's variable-length kernel (`torch.nn.attention.varlen.varlen_attn`)
  over the rows' offsets, no padding anywhere;
- "padded" (everywhere else): Q/K/V scattered into [rows, longest] for one SDPA call with a key mask, and gathered
  back. The engine packs rows of similar length together, so this pads little, and a batch whose rows are all
  the same length is a view, not a copy.
Q, K and V run as one matmul: their Linear modules' parameters are re-pointed into one fused weight and bias (the
model's own values, moved once; no second copy is kept), where they are plain Linear layers (int8 runs three).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

ATTENTIONS = ("padded", "varlen")
HALF = (torch.float16, torch.bfloat16)


def unsupported(model: torch.nn.Module) -> str | None:
    """Return why the packed path cannot run model (None: it can): BERT with absolute positions only."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", "unknown")
    if model_type != "bert":
        return f"the packed path runs BERT encoders only, not {model_type!r}"
    if getattr(config, "position_embedding_type", "absolute") != "absolute" or getattr(config, "is_decoder", False):
        return "the packed path runs BERT encoders with absolute positions only"
    if not hasattr(model, "embeddings") or not hasattr(model, "encoder"):
        return "the packed path needs a BertModel (embeddings, encoder)"
    return None


def fuse_qkv(attention: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Return (weight [3w, w], bias [3w]) of an attention's Q, K and V as one Linear, its modules' parameters now views
    of it; None where they are not plain Linear layers with biases (an int8 copy: they run as three)."""
    modules = (attention.query, attention.key, attention.value)
    if not all(type(p) is torch.nn.Linear and p.bias is not None for p in modules):
        return None
    parts = cast(tuple[torch.nn.Linear, ...], modules)
    fused = getattr(attention, "_packed_qkv", None)
    if fused is not None and all(p.weight.data_ptr() == fused[0][i * p.out_features :].data_ptr() for i, p in enumerate(parts)):
        return fused  # fused before (the same module loaded again)
    with torch.no_grad():
        weight = torch.cat([p.weight for p in parts]).contiguous()
        bias = torch.cat([p.bias for p in parts]).contiguous()
        width = parts[0].out_features
        for i, p in enumerate(parts):  # the module keeps working unchanged, on views of the fused tensors
            p.weight.data = weight[i * width : (i + 1) * width]
            p.bias.data = bias[i * width : (i + 1) * width]
    setattr(attention, "_packed_qkv", (weight, bias))  # noqa: B010  (a plain attribute, not a parameter)
    return weight, bias


def varlen_attention() -> Callable[..., torch.Tensor] | None:
    """Return torch's FlashAttention variable-length function where this torch has it (2.10 and later), else None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return cast(Callable[..., torch.Tensor], varlen_attn)  # it returns one tensor unless asked for more


class PackedBert:
    """Runs a BertModel (models/encoder/bert.py, or transformers') on packed batches: (ids, positions, rows, offsets)
    -> hidden states [tokens, width]."""

    def __init__(self, model: torch.nn.Module, attention: str = "padded", fuse: bool = True) -> None:
        reason = unsupported(model)
        if reason:
            raise ValueError(reason)
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r} (one of {', '.join(ATTENTIONS)})")
        self.model = cast(Any, model)  # a BertModel, ours or transformers' (submodules reached by name)
        self.attention = attention
        self.heads = int(self.model.config.num_attention_heads)
        self.layers = list(self.model.encoder.layer)
        self.qkv = [fuse_qkv(layer.attention.self) if fuse else None for layer in self.layers]
        self._varlen = varlen_attention() if attention == "varlen" else None
        self.forward: Callable[..., torch.Tensor] = self._forward

    def compile(self, mode: str) -> None:
        """Run the layers through torch.compile in mode (shapes dynamic: token counts vary batch to batch)."""
        self.forward = torch.compile(self._forward, mode=mode, dynamic=True)

    def __call__(
        self, ids: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor, offsets: torch.Tensor, longest: int
    ) -> torch.Tensor:
        """Return the last hidden states [tokens, width] of one packed batch (all tensors on the model's device)."""
        return self.forward(ids, positions, segments, offsets, longest)

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor, offsets: torch.Tensor, longest: int
    ) -> torch.Tensor:
        embeddings = self.model.embeddings
        x = embeddings.word_embeddings(ids) + embeddings.position_embeddings(positions)
        x = embeddings.LayerNorm(x + embeddings.token_type_embeddings.weight[0])  # token type 0, as the padded path
        layout = attention_layout(segments, positions, offsets, longest, x.shape[0], padded=self._varlen is None)
        for layer, fused in zip(self.layers, self.qkv, strict=True):
            x = self._layer(layer, fused, x, layout)
        return x

    def _layer(
        self, layer: Any, fused: tuple[torch.Tensor, torch.Tensor] | None, x: torch.Tensor, layout: dict[str, Any]
    ) -> torch.Tensor:
        """Return one encoder layer's output (post-LayerNorm BERT: attention, add & norm, FFN, add & norm)."""
        own = layer.attention.self
        qkv = F.linear(x, *fused) if fused is not None else torch.cat([own.query(x), own.key(x), own.value(x)], dim=1)
        context = attend(qkv, layout, self.heads, self._varlen)
        out = layer.attention.output
        x = out.LayerNorm(out.dense(context) + x)
        hidden = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(x))
        return layer.output.LayerNorm(layer.output.dense(hidden) + x)


def attention_layout(
    segments: torch.Tensor, positions: torch.Tensor, offsets: torch.Tensor, longest: int, tokens: int, padded: bool
) -> dict[str, Any]:
    """Return what attention needs for one batch, computed once for all its layers (on the device, no host sync)."""
    rows = offsets.shape[0] - 1
    layout: dict[str, Any] = {"rows": rows, "longest": longest, "offsets": offsets}
    if padded and rows * longest != tokens:  # rows of unequal length: scattered into a grid, keys masked
        layout["index"] = segments.long() * longest + positions.long()
        lengths = (offsets[1:] - offsets[:-1]).long()
        layout["mask"] = (torch.arange(longest, device=offsets.device)[None, :] < lengths[:, None])[:, None, None, :]
    return layout


def attend(qkv: torch.Tensor, layout: dict[str, Any], heads: int, varlen: Callable[..., torch.Tensor] | None) -> torch.Tensor:
    """Return the attention context [tokens, width] of fused Q/K/V [tokens, 3 x width], each row attending to itself."""
    tokens, width = qkv.shape[0], qkv.shape[1] // 3
    head = width // heads
    if varlen is not None:
        q, k, v = (t.contiguous() for t in qkv.view(tokens, 3, heads, head).unbind(1))
        offsets, longest = layout["offsets"], layout["longest"]
        return varlen(q, k, v, offsets, offsets, longest, longest).reshape(tokens, width)
    rows, longest = layout["rows"], layout["longest"]
    index = layout.get("index")
    if index is None:  # every row is `longest` long: the packed rows already are a padded batch
        grid = qkv
    else:
        grid = qkv.new_zeros(rows * longest, 3 * width)
        grid[index] = qkv
    q, k, v = (t.transpose(1, 2) for t in grid.view(rows, longest, 3, heads, head).unbind(2))
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.get("mask"))
    context = context.transpose(1, 2).reshape(rows * longest, width)
    return context if index is None else context[index]


def choose_attention(model: Any, device: torch.device, dtype: torch.dtype) -> str:
    """Return "varlen" where FlashAttention's variable-length kernel runs here and agrees with padded SDPA on a probe
    (CUDA, fp16/bf16), else "padded"."""
    if device.type != "cuda" or dtype not in HALF or varlen_attention() is None:
        return "padded"
    try:
        generator = torch.Generator(device=device).manual_seed(0)
        heads = int(model.config.num_attention_heads)
        width = int(model.config.hidden_size)
        qkv = torch.randn(37, 3 * width, device=device, dtype=dtype, generator=generator)
        offsets = torch.tensor([0, 5, 6, 37], device=device, dtype=torch.int32)
        segments = torch.repeat_interleave(torch.arange(3, device=device), torch.tensor([5, 1, 31], device=device))
        positions = torch.arange(37, device=device) - offsets[:-1].long()[segments]
        probes = [
            attend(qkv, attention_layout(segments, positions, offsets, 31, 37, padded=varlen is None), heads, varlen).float()
            for varlen in (None, varlen_attention())
        ]
        gap = float((probes[0] - probes[1]).abs().max())
    except (RuntimeError, TypeError) as exc:  # no kernel for this GPU, head size or dtype
        log.warning("packed attention: varlen unavailable here (%s); padded SDPA instead", str(exc)[:200])
        return "padded"
    if gap > 2e-2:
        log.warning("packed attention: varlen differs from padded SDPA by %.3g on a probe; padded SDPA instead", gap)
        return "padded"
    return "varlen"
