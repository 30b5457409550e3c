"""Every backend x precision against sentence-transformers loading the same random model folders (4 architectures).

Backends that cannot run on this machine skip with the reason the engine gives.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch

from core.errors import ModelLoadError, UsageError
from models.encoder.backends.registry import BACKENDS, unavailable_reason
from models.encoder.calibration import TIE
from models.encoder.engine import encode_texts
from models.encoder.files import embedding_dim, model_info
from models.encoder.loader import get_encoder, load_encoder, spec_version
from models.encoder.precision import FidelityRefused
from models.encoder.spec import EncoderSpec
from models.encoder.st_layout import read_model_info
from models.encoder.text_encoder import TextEncoder
from tests.helpers import cos_rows
from tests.model.st_models import ARCHS, Arch, save_random_model

TEXTS = [
    "a",
    "ok",
    "?",
    "",
    "Hello world",
    "The striker scored twice in the second half to win the cup final.",
    "Simmer the tomatoes with garlic and basil for twenty minutes.",
    "42 1337 3.14159 2024-01-31",
    "¿Dónde está la biblioteca? Ünïcödé — ok 🙂",
    "東京は日本の首都です。",
    "The central bank raised interest rates by a quarter point on Wednesday after markets had priced it in.",
    " ".join(["river mountain engine coffee signal harvest window planet violin ledger"] * 30),  # past max length
    "goal " * 40,
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st-models")
    return {arch.name: save_random_model(arch, root, seed=i) for i, arch in enumerate(ARCHS)}


@pytest.fixture(scope="module")
def st_reference(folders: dict[str, Path]) -> dict[str, np.ndarray]:
    from sentence_transformers import SentenceTransformer

    out = {}
    for name, path in folders.items():
        model = SentenceTransformer(str(path), device="cpu")
        out[name] = model.encode(TEXTS, batch_size=4, convert_to_numpy=True)
    return out


def _skip_unless_runs(backend: str, precision: str) -> None:
    reason = unavailable_reason(backend, precision, torch.device("cpu"))
    if reason:
        pytest.skip(f"{backend}/{precision}: {reason}")


def _refused_unless_bert(spec: EncoderSpec, arch: Arch) -> bool:
    """Return True (after checking the clear refusal) where the packed backend is pinned on a model that is not BERT."""
    if spec.backend != "torch-packed" or arch.config == "BertConfig":
        return False
    with pytest.raises(UsageError, match=r"cannot run here: the packed path runs BERT encoders only"):
        load_encoder(spec)
    return True


@pytest.mark.parametrize("arch", ARCHS, ids=[a.name for a in ARCHS])
def test_model_info_from_the_folder(folders: dict[str, Path], arch: Arch) -> None:
    info = read_model_info(folders[arch.name], max_seq_length=256)
    assert (info.dim, info.pooling, info.normalize, info.max_seq_length) == (
        arch.width,
        arch.pooling,
        arch.normalize,
        arch.max_seq_length,
    )
    assert info.version == f"{arch.name}@{info.digest}" and len(info.digest) == 12
    assert embedding_dim(EncoderSpec(model_path=str(folders[arch.name]))) == arch.width


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS, ids=[a.name for a in ARCHS])
def test_fp32_matches_sentence_transformers(
    folders: dict[str, Path], st_reference: dict[str, np.ndarray], arch: Arch, backend: str, tmp_path: Path
) -> None:
    _skip_unless_runs(backend, "fp32")
    folder = str(folders[arch.name])
    spec = EncoderSpec(device="cpu", precision="fp32", backend=backend, model_path=folder, cache_dir=str(tmp_path))
    if _refused_unless_bert(spec, arch):
        return
    encoder = load_encoder(spec)
    reference = st_reference[arch.name]
    for budget in (64, 100_000):  # many small batches, and one padded batch
        out, stats = encode_texts(encoder, TEXTS, token_budget=budget)
        assert out.shape == reference.shape == (len(TEXTS), arch.width)
        cos = cos_rows(out, reference)
        assert cos.min() >= 0.9999, (arch.name, backend, budget, TEXTS[int(np.argmin(cos))][:30], float(cos.min()))
        assert stats.truncated >= 1
    norms = np.linalg.norm(out, axis=1)
    if arch.normalize:
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    np.testing.assert_allclose(norms, np.linalg.norm(reference, axis=1), rtol=1e-3)  # unnormalised models stay so


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS[:2], ids=[a.name for a in ARCHS[:2]])
def test_reduced_precision_meets_its_floor_or_is_refused(
    folders: dict[str, Path], st_reference: dict[str, np.ndarray], arch: Arch, backend: str, precision: str, tmp_path: Path
) -> None:
    _skip_unless_runs(backend, precision)
    spec = EncoderSpec(
        device="cpu", precision=precision, backend=backend, model_path=str(folders[arch.name]), cache_dir=str(tmp_path)
    )
    floor = spec.int8_floor if precision == "int8" else spec.float_floor
    if _refused_unless_bert(spec, arch):
        return
    try:
        encoder = load_encoder(spec)
    except FidelityRefused as exc:
        assert f"floor {floor}" in str(exc)
        return
    assert encoder.fidelity.min >= floor
    assert encoder.version.endswith(f"+{backend}-{precision}")
    out, _ = encode_texts(encoder, TEXTS)
    # the probe floor carries over to other texts with some slack (random weights, tiny widths)
    assert cos_rows(out, st_reference[arch.name]).min() >= floor - 0.01


def test_a_pinned_mode_under_its_floor_is_refused_naming_floor_and_cosine(folders: dict[str, Path]) -> None:
    _skip_unless_runs("torch", "bf16")
    spec = EncoderSpec(
        device="cpu", precision="bf16", backend="torch", model_path=str(folders["bert-mean"]), float_floor=0.99999999
    )
    with pytest.raises(
        FidelityRefused, match=r"torch/bf16 refused: min cosine to torch fp32 is [01]\.\d{6} .* floor 0\.99999999"
    ):
        load_encoder(spec)


@pytest.fixture(scope="module")
def calibrated_bert(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[EncoderSpec, TextEncoder]:
    """Return the BERT's auto spec (budgets 256 and 1024) and the encoder its one calibration, in a fresh cache, chose."""
    cache = tmp_path_factory.mktemp("bert-calibration")
    spec = EncoderSpec(device="cpu", model_path=str(folders["bert-mean"]), cache_dir=str(cache), calibration_budgets=(256, 1024))
    return spec, load_encoder(spec)


@pytest.fixture
def bert_cache(calibrated_bert: tuple[EncoderSpec, TextEncoder], tmp_path: Path) -> tuple[EncoderSpec, TextEncoder]:
    """Return calibrated_bert with its spec pointing at a copy of the calibrated cache (tests may write to theirs)."""
    spec, encoder = calibrated_bert
    shutil.copytree(str(spec.cache_dir), tmp_path / "cache")
    return replace(spec, cache_dir=str(tmp_path / "cache")), encoder


def test_auto_calibrates_once_and_persists_per_device_kind(bert_cache: tuple[EncoderSpec, TextEncoder]) -> None:
    spec, first = bert_cache
    cache = Path(str(spec.cache_dir))
    record = first.mode_record()
    assert record["calibration_from_cache"] is False
    assert first.fidelity.min >= (spec.int8_floor if first.backend.precision == "int8" else spec.float_floor)
    assert first.token_budget in (256, 1024)
    table = cast("list[dict[str, Any]]", record["calibration_candidates"])
    assert {row["mode"].split("@")[0] for row in table} >= {"torch/fp32"}
    chosen = [row for row in table if row["mode"] == first.mode.label]
    fastest = max(r["tokens_per_s"] for r in table if r["fidelity"] and r["fidelity"]["min"] >= r["floor"])
    assert chosen and chosen[0]["tokens_per_s"] >= fastest * (1 - TIE)  # the fastest, or tied with it (within TIE)
    assert all(0 < row["padding_efficiency"] <= 1 for row in table)
    assert not [row for row in table if "/x" in row["mode"]]  # rounding to 16 pads the log-uniform corpus under 0.97
    files = list((cache / "calibration").glob("*/*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    assert stored["mode"]["backend"] == first.backend.name and stored["key"]["model"] == model_info(spec).version
    # The next process on the same kind of machine reads the choice: same mode and version, nothing measured.
    again = load_encoder(spec)
    assert again.mode_record()["calibration_from_cache"] is True
    assert (again.mode, again.version) == (first.mode, first.version)
    assert spec_version(spec) == first.version
    # Another floor is another question: the stored answer is not reused.
    stricter = load_encoder(
        EncoderSpec(
            device="cpu",
            model_path=spec.model_path,
            cache_dir=str(cache),
            calibration_budgets=(256, 1024),
            int8_floor=0.9999999,
        )
    )
    assert stricter.mode_record()["calibration_from_cache"] is False
    assert stricter.backend.precision != "int8"


def test_auto_without_a_cache_folder_keeps_the_fixed_default(folders: dict[str, Path]) -> None:
    spec = EncoderSpec(device="cpu", model_path=str(folders["distilbert-cls"]))
    assert spec_version(spec) == model_info(spec).version  # torch fp32: no suffix, no weights loaded
    encoder = get_encoder(spec)
    assert (encoder.backend.name, encoder.backend.precision, encoder.calibration) == ("torch", "fp32", None)


@pytest.mark.parametrize(("backend", "artifact"), [("openvino", "model.xml"), ("onnxruntime", "model.onnx")])
def test_a_conversion_is_cached_by_digest_backend_and_precision(
    folders: dict[str, Path], tmp_path: Path, backend: str, artifact: str
) -> None:
    _skip_unless_runs(backend, "fp32")
    spec = EncoderSpec(
        device="cpu", precision="fp32", backend=backend, model_path=str(folders["bert-mean"]), cache_dir=str(tmp_path)
    )
    first = load_encoder(spec)
    files = list((tmp_path / "converted").glob(f"*/*/{artifact}"))
    assert len(files) == 1 and files[0].parent.parent.name == first.info.digest
    assert files[0].parent.name.startswith(f"{backend}-") and files[0].parent.name.endswith("-fp32")
    assert not list((tmp_path / "converted").glob("*/*/*.tmp-*"))  # written under a temporary name, then renamed
    stamp = files[0].stat().st_mtime_ns
    second = load_encoder(spec)
    assert files[0].stat().st_mtime_ns == stamp  # read back, not converted again
    a, _ = encode_texts(first, TEXTS)
    b, _ = encode_texts(second, TEXTS)
    assert np.array_equal(a, b)
    assert first.version.endswith(f"+{backend}-fp32")


def test_onnxruntime_streams_run_batches_at_once_with_the_same_vectors(folders: dict[str, Path], tmp_path: Path) -> None:
    _skip_unless_runs("onnxruntime", "fp32")
    one_spec = EncoderSpec(
        device="cpu", precision="fp32", backend="onnxruntime", model_path=str(folders["mpnet-max"]), cache_dir=str(tmp_path)
    )
    one = load_encoder(one_spec)
    two = load_encoder(replace(one_spec, streams=2, num_threads=2))
    assert (one.backend.streams, two.backend.streams) == (1, 2)
    a, _ = encode_texts(one, TEXTS, token_budget=64)
    b, _ = encode_texts(two, TEXTS, token_budget=64)  # many small batches, two in flight at a time
    assert cos_rows(a, b).min() >= 0.99999


def test_unsupported_layouts_are_refused_clearly(folders: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    path = tmp_path / "dense"
    shutil.copytree(folders["bert-mean"], path)
    modules = json.loads((path / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="Dense"):
        read_model_info(path)
    (path / "modules.json").write_text(json.dumps(modules[:2]))
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_sqrt_len_tokens": True}))
    with pytest.raises(ModelLoadError, match="pooling"):
        read_model_info(path)


def test_resolve_mode_pins_autos_choice_for_shard_workers(bert_cache: tuple[EncoderSpec, TextEncoder], tmp_path: Path) -> None:
    from models.encoder.loader import resolve_mode

    spec, chosen = bert_cache
    pinned = spec.pinned(resolve_mode(spec))
    assert (pinned.backend, pinned.precision, pinned.token_budget, pinned.length_multiple) == (
        chosen.backend.name,
        chosen.backend.precision,
        chosen.token_budget,
        chosen.backend.length_multiple,
    )
    # A worker with another (empty) cache folder loads the same mode and version, and does not calibrate.
    worker = load_encoder(EncoderSpec(**{**pinned.__dict__, "cache_dir": str(tmp_path / "elsewhere")}))
    assert (worker.mode, worker.version, worker.calibration) == (chosen.mode, chosen.version, None)
    assert spec_version(pinned) == chosen.version
    assert not (tmp_path / "elsewhere" / "calibration").exists()
