"""A BERT encoder in plain torch, loaded from a model folder's safetensors without importing transformers.

It computes what transformers' BertModel computes for an encoder (embeddings, post-LayerNorm blocks with SDPA
attention, no pooler) and names its parameters as transformers does, so the folder's weights load as they are and
everything that reaches into the model by name (the packed path, the int8 copies, OpenVINO's layer roles) works on
it unchanged. Importing transformers cost a run process 1.7-2 s of CPU on a 2-core host (torch.distributed.tensor,
torch._dynamo and sympy come with it); this module costs nothing beyond torch. Folders it does not describe
(another architecture, relative positions, a decoder, only a pickled checkpoint) return None from `bert_config` and
load through transformers (`models/encoder/files.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # picklable, as the modules are copied and sent
    "gelu": F.gelu,
    "gelu_new": partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}
ATTENTIONS = ("sdpa", "eager")
TRANSFORMERS_DEFAULTS: dict[str, Any] = {  # transformers.BertConfig's defaults, for the fields a config.json omits
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}
DROPPED = ("pooler.", "embeddings.position_ids", "embeddings.token_type_ids")  # unused by an encoder's last states


@dataclass(frozen=True)
class BertConfig:
    """The fields of a BERT config.json the encoder needs (the names transformers gives them)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int | None
    model_type: str = "bert"
    position_embedding_type: str = "absolute"
    is_decoder: bool = False


def bert_config(folder: Path) -> BertConfig | None:
    """Return the folder's BertConfig where this module computes its model exactly (None: load it with transformers);
    a field the file leaves out takes transformers' BertConfig default."""
    raw = {**TRANSFORMERS_DEFAULTS, **json.loads((folder / "config.json").read_text())}
    plain = (
        raw.get("model_type") == "bert"
        and raw.get("position_embedding_type", "absolute") == "absolute"
        and not raw.get("is_decoder", False)
        and not raw.get("add_cross_attention", False)
        and raw["hidden_act"] in ACTIVATIONS
        and raw["hidden_size"] % raw["num_attention_heads"] == 0
        and (folder / "model.safetensors").is_file()
    )
    if not plain:
        return None
    return BertConfig(**{k: v for k, v in raw.items() if k in BertConfig.__dataclass_fields__})


class Output(NamedTuple):
    """What the encoder returns, named as transformers names it."""

    last_hidden_state: torch.Tensor


class BertEmbeddings(nn.Module):
    """Word, position and token-type (always 0) embeddings, summed in transformers' order, then LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Return the embeddings [rows, length, width] of right-padded ids."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x + self.position_embeddings(positions))


class BertSelfAttention(nn.Module):
    """Q, K and V projections and scaled dot-product attention over the unmasked keys."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        width = config.hidden_size
        self.heads = config.num_attention_heads
        self.query, self.key, self.value = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.implementation = "sdpa"

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Return the attention context [rows, length, width]; keep is the key mask [rows, 1, 1, length] (bool)."""
        rows, length, width = x.shape
        q, k, v = (p(x).view(rows, length, self.heads, -1).transpose(1, 2) for p in (self.query, self.key, self.value))
        if self.implementation == "sdpa":
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:  # written out: an exported graph of plain MatMul/Softmax (ONNX Runtime ran it faster)
            scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
            context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return context.transpose(1, 2).reshape(rows, length, width)


class BertSelfOutput(nn.Module):
    """Dense projection of the attention context, residual add and LayerNorm (also the FFN's output, `BertOutput`)."""

    def __init__(self, inputs: int, width: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(inputs, width)
        self.LayerNorm = nn.LayerNorm(width, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Return LayerNorm(dense(x) + residual)."""
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    """Self-attention and its output block."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config.hidden_size, config.hidden_size, config.layer_norm_eps)


class BertIntermediate(nn.Module):
    """The FFN's up-projection and activation."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return act(dense(x))."""
        return self.intermediate_act_fn(self.dense(x))


class BertLayer(nn.Module):
    """One post-LayerNorm encoder block: attention, add & norm, FFN, add & norm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config.intermediate_size, config.hidden_size, config.layer_norm_eps)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Return the block's output [rows, length, width]."""
        attended = self.attention.output(self.attention.self(x, keep), x)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    """The stack of blocks."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertModel(nn.Module):
    """(input_ids, attention_mask) -> Output(last_hidden_state), as transformers' BertModel without its pooler."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Output:
        """Return the last hidden states of right-padded ids (attention_mask: 1 for a real token)."""
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        keep = mask.bool()[:, None, None, :]
        x = self.embeddings(input_ids)
        for layer in self.encoder.layer:
            x = layer(x, keep)
        return Output(x)

    def set_attn_implementation(self, name: str) -> None:
        """Switch every block's attention to "sdpa" (one fused call) or "eager" (written out), as transformers does."""
        if name not in ATTENTIONS:
            raise ValueError(f"unknown attention {name!r} (one of {', '.join(ATTENTIONS)})")
        for module in self.modules():
            if isinstance(module, BertSelfAttention):
                module.implementation = name


def load_bert(folder: Path, config: BertConfig) -> BertModel:
    """Return the folder's encoder in fp32 and eval mode, its weights read from model.safetensors (strictly: every
    parameter present, nothing unknown but the pooler and transformers' buffers)."""
    from safetensors.torch import load_file

    state: dict[str, Any] = load_file(str(folder / "model.safetensors"))
    prefix = "bert." if any(name.startswith("bert.") for name in state) else ""
    names = {name: name.removeprefix(prefix) for name in state if name.startswith(prefix)}
    state = {own: state[name].float() for name, own in names.items() if not own.startswith(DROPPED)}
    model = BertModel(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()
