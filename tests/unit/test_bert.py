"""The plain-torch BERT (models/encoder/bert.py) against transformers' BertModel, what it refuses, and what it spares
a run process: the same last hidden states, transformers for the folders it does not describe, a clear error for
broken weights, and no transformers or torch._dynamo import on a run's path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from core.errors import ModelLoadError
from models.encoder.bert import BertModel, bert_config
from models.encoder.files import load_module, load_transformers_module, model_dir
from models.encoder.st_layout import read_model_info
from tests.helpers import fresh_interpreter_output


def _random_bert(folder: Path, head: bool = False, **config: Any) -> Path:
    """Return folder holding a random transformers BERT (with a masked-LM head: weights under "bert.")."""
    import transformers

    torch.manual_seed(0)
    fields = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96, **config}
    bert_config_ = transformers.BertConfig(vocab_size=500, max_position_embeddings=64, **fields)
    model = (transformers.BertForMaskedLM if head else transformers.BertModel)(bert_config_)
    with torch.no_grad():  # wider than the default init, so every layer shapes the output
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(str(folder), safe_serialization=True)
    shutil.copy(model_dir() / "tokenizer.json", folder / "tokenizer.json")
    return folder


def _batch(rows: int, length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return right-padded ids and their mask, rows of random lengths 1..length (one full row)."""
    generator = torch.Generator().manual_seed(rows * 1000 + length)
    ids = torch.randint(1, vocab, (rows, length), generator=generator)
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


def _hidden(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize(
    "variant",
    [{}, {"hidden_act": "gelu_new", "layer_norm_eps": 1e-5}, {"head": True}, {"hidden_act": "relu", "type_vocab_size": 1}],
    ids=["bert", "gelu-tanh", "masked-lm-checkpoint", "relu-one-token-type"],
)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_plain_bert_computes_what_transformers_computes(tmp_path: Path, variant: dict[str, Any], attention: str) -> None:
    folder = _random_bert(tmp_path / "bert", **variant)
    info = read_model_info(folder)
    ours, theirs = load_module(info), load_transformers_module(info)
    assert isinstance(ours, BertModel)
    ours.set_attn_implementation(attention)
    theirs.set_attn_implementation(attention)  # type: ignore[operator]
    for rows, length in [(1, 1), (3, 7), (8, 40), (2, 64)]:
        ids, mask = _batch(rows, length, 500)
        real = mask.bool()
        gap = (_hidden(ours, ids, mask) - _hidden(theirs, ids, mask))[real].abs().max()
        assert float(gap) <= 1e-6, (rows, length, float(gap))


def test_minilm_loads_as_the_plain_bert_with_transformers_vectors() -> None:
    info = read_model_info(model_dir())
    ours, theirs = load_module(info), load_transformers_module(info)
    assert isinstance(ours, BertModel)
    ids, mask = _batch(6, 128, 30522)
    assert float((_hidden(ours, ids, mask) - _hidden(theirs, ids, mask))[mask.bool()].abs().max()) <= 1e-6


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "roberta"},
        {"position_embedding_type": "relative_key"},
        {"is_decoder": True},
        {"hidden_act": "quick_gelu"},
        {"num_attention_heads": 5},
        {"weights": "pytorch_model.bin"},
    ],
    ids=["roberta", "relative-positions", "decoder", "unknown-activation", "heads-do-not-divide-width", "pickled-weights-only"],
)
def test_folders_it_does_not_describe_load_through_transformers(tmp_path: Path, change: dict[str, object]) -> None:
    folder = _random_bert(tmp_path / "bert")
    assert bert_config(folder) is not None
    config = json.loads((folder / "config.json").read_text())
    if "weights" in change:
        torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    else:
        config.update(change)
        (folder / "config.json").write_text(json.dumps(config))
    assert bert_config(folder) is None


def test_fields_a_config_leaves_out_take_transformers_defaults(tmp_path: Path) -> None:
    folder = _random_bert(tmp_path / "bert", layer_norm_eps=1e-12, hidden_act="gelu")
    config = json.loads((folder / "config.json").read_text())
    for name in ("layer_norm_eps", "hidden_act", "type_vocab_size", "pad_token_id"):
        config.pop(name, None)
    (folder / "config.json").write_text(json.dumps(config))
    info = read_model_info(folder)
    ours, theirs = load_module(info), load_transformers_module(info)
    assert isinstance(ours, BertModel)
    ids, mask = _batch(4, 30, 500)
    assert float((_hidden(ours, ids, mask) - _hidden(theirs, ids, mask))[mask.bool()].abs().max()) <= 1e-6


def test_a_checkpoint_missing_a_weight_or_cut_short_is_a_model_load_error(tmp_path: Path) -> None:
    folder = _random_bert(tmp_path / "bert")
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    del state["encoder.layer.1.output.dense.weight"]
    save_file(state, str(weights))
    with pytest.raises(ModelLoadError, match=r"encoder\.layer\.1\.output\.dense\.weight"):
        load_module(read_model_info(folder))
    weights.write_bytes(weights.read_bytes()[:4000])
    with pytest.raises(ModelLoadError, match="cannot load the model"):
        load_module(read_model_info(folder))


def test_a_run_process_loads_minilm_and_trains_the_ranker_without_transformers_or_dynamo() -> None:
    # each cost a run process 1-2 s of imports on a 2-core host: transformers (with torch.distributed.tensor and
    # sympy) to build the model, torch._dynamo on torch.optim's first call
    script = (
        "import sys, numpy as np;"
        "from models.encoder.files import load_module, model_dir; from models.encoder.st_layout import read_model_info;"
        "from models.recommender.ranker_net import TrainConfig, fit_net;"
        "load_module(read_model_info(model_dir()));"
        "fit_net(np.random.default_rng(0).random((50, 3)), np.arange(50) % 2, TrainConfig(epochs=1));"
        "print(sorted(m for m in ('transformers', 'torch._dynamo', 'sympy') if m in sys.modules))"
    )
    assert fresh_interpreter_output(script) == "[]"
