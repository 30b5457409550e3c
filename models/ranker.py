"""Stage two of the ranker: a small MLP over (user, candidate item) features, its training and its file.

Features of one (user, item) pair, in FEATURE_NAMES order, all as of a reference time ``now``:
    retrieval_score  cosine of user vector and item embedding: stage one's score, read from the cache payload
    log_popularity   log(1 + interactions with the item before now)
    freshness_days   days from the item's created_at to now (never negative)
    topic_affinity   share of the user's interactions before now that fall in the item's topic
    topic_score      zero-shot probability of the item's topic (item_scores.parquet)
Unknown items get popularity 0, freshness 0, topic score 0; unknown users (or topics) get affinity 0.

Training (train_ranker) is a time split of the interaction log: features from interactions before a cutoff,
label 1 for items a user first touches at or after it, label 0 for items the user never touched (sampled
uniformly, negatives_per_positive per positive). Users are split into train and held-out users; metrics
(AUC, NDCG@10) are computed on the held-out users for the model and for the retrieval score alone.
Retrieval scores of the training pairs come from a RetrievalFn: embedding_retrieval is stage one's exact
formula over item embeddings; hashed_text_vectors is a stand-in embedding (hashed TF-IDF of the item text)
for tests and demos run without the encoder. Uniform negatives are easy (most are unpopular, off-topic
items), so absolute metrics are optimistic; the comparison with retrieval alone on the same pairs is fair.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl
import torch

from models.retrieval import Interactions, candidates_table, interaction_weight_expr, top_k_items, user_vectors
from nightscore.errors import ModelLoadError

log = logging.getLogger(__name__)

FEATURE_NAMES: tuple[str, ...] = ("retrieval_score", "log_popularity", "freshness_days", "topic_affinity", "topic_score")
ITEM_FEATURE_COLUMNS: tuple[str, ...] = ("item_id", "topic", "topic_score", "log_popularity", "freshness_days")
AFFINITY_COLUMNS: tuple[str, ...] = ("user_id", "topic", "affinity")
RANKER_FORMAT = 1
NDCG_K = 10

RetrievalFn = Callable[[pl.DataFrame, pl.DataFrame, datetime], np.ndarray]
"""(history interactions, pairs with user_id and item_id, reference time) -> retrieval score per pair."""

_TOKEN = re.compile(r"[a-z0-9]+")
_DAY_S = 86_400.0


# --------------------------------------------------------------------------------------------
# Feature tables (pure: frames in, frames out)
# --------------------------------------------------------------------------------------------


def _before(interactions: pl.DataFrame, now: datetime) -> pl.DataFrame:
    """Return the interactions strictly before now."""
    return interactions.filter(pl.col("ts") < pl.lit(now))


def item_features(items: pl.DataFrame, interactions: pl.DataFrame, item_scores: pl.DataFrame, now: datetime) -> pl.DataFrame:
    """Return the item features table (ITEM_FEATURE_COLUMNS) as of now; interactions from now on are ignored.

    Args:
        items: item_id and created_at (timezone-aware, like now).
        interactions: user_id, item_id, ts.
        item_scores: item_id, topic, topic_score (the run's zero-shot topics); items without a row get
            a null topic and topic score 0.
        now: the reference time of popularity and freshness.
    """
    counts = _before(interactions, now).group_by("item_id").agg(pl.len().alias("n_interactions"))
    age_days = (pl.lit(now) - pl.col("created_at")).dt.total_seconds() / _DAY_S
    return (
        items.select("item_id", "created_at")
        .join(item_scores.select("item_id", "topic", "topic_score"), on="item_id", how="left")
        .join(counts, on="item_id", how="left")
        .select(
            "item_id",
            pl.col("topic").cast(pl.String),
            pl.col("topic_score").cast(pl.Float64).fill_null(0.0),
            pl.col("n_interactions").fill_null(0).cast(pl.Float64).log1p().alias("log_popularity"),
            age_days.clip(lower_bound=0.0).cast(pl.Float64).alias("freshness_days"),
        )
        .sort("item_id")
    )


def user_topic_affinity(interactions: pl.DataFrame, item_topics: pl.DataFrame, now: datetime) -> pl.DataFrame:
    """Return (user_id, topic, affinity): each user's share of interactions before now per topic.

    Only interactions with items of a known topic count; shares of one user sum to 1.
    """
    joined = _before(interactions, now).join(item_topics.select("item_id", "topic"), on="item_id", how="inner")
    counts = joined.drop_nulls("topic").group_by("user_id", "topic").agg(pl.len().alias("n"))
    share = (pl.col("n") / pl.col("n").sum().over("user_id")).cast(pl.Float64).alias("affinity")
    return counts.select("user_id", "topic", share).sort("user_id", "topic")


def build_features(pairs: pl.DataFrame, item_table: pl.DataFrame, affinity: pl.DataFrame) -> pl.DataFrame:
    """Return pairs (user_id, item_id, retrieval_score, ...) in their order with the FEATURE_NAMES columns added."""
    joined = pairs.join(item_table, on="item_id", how="left", maintain_order="left").join(
        affinity, on=["user_id", "topic"], how="left", maintain_order="left"
    )
    features = joined.with_columns(
        pl.col("retrieval_score").cast(pl.Float64),
        pl.col("log_popularity").fill_null(0.0),
        pl.col("freshness_days").fill_null(0.0),
        pl.col("affinity").fill_null(0.0).alias("topic_affinity"),
        pl.col("topic_score").fill_null(0.0),
    )
    return features.select(*(c for c in pairs.columns if c not in FEATURE_NAMES), *FEATURE_NAMES)


def feature_matrix(frame: pl.DataFrame) -> np.ndarray:
    """Return the FEATURE_NAMES columns of a feature frame as a float32 (rows, features) matrix."""
    return np.ascontiguousarray(frame.select(FEATURE_NAMES).to_numpy(), dtype=np.float32)


def popular_items(item_table: pl.DataFrame, n: int) -> tuple[list[str], np.ndarray]:
    """Return the n most popular item ids and their log popularity (ties by item id)."""
    top = item_table.sort(["log_popularity", "item_id"], descending=[True, False]).head(n)
    return top.get_column("item_id").to_list(), top.get_column("log_popularity").to_numpy().astype(np.float32)


class FeatureIndex:
    """Item features and user affinities in memory: the per-request twin of build_features (same values)."""

    def __init__(self, item_table: pl.DataFrame, affinity: pl.DataFrame) -> None:
        topics = sorted({t for t in item_table.get_column("topic").to_list() if t is not None})
        self._topic_col = {t: i for i, t in enumerate(topics)}
        self._item_row = {item: i for i, item in enumerate(item_table.get_column("item_id").to_list())}
        # The last row / column of each array holds zeros: the defaults of unknown items, users and topics.
        values = item_table.select("log_popularity", "freshness_days", "topic_score").to_numpy().astype(np.float32)
        self._items = np.vstack([values, np.zeros((1, 3), dtype=np.float32)])
        item_topics = [self._topic_col.get(t, len(topics)) for t in item_table.get_column("topic").to_list()]
        self._item_topic = np.array([*item_topics, len(topics)], dtype=np.int64)
        self._user_row, self._affinity = self._affinity_matrix(affinity, len(topics))
        self.n_items, self.n_users = item_table.height, len(self._user_row)

    def _affinity_matrix(self, affinity: pl.DataFrame, n_topics: int) -> tuple[dict[str, int], np.ndarray]:
        """Return (user id -> row, (users + 1, topics + 1) affinity matrix) over the known topics."""
        known = affinity.filter(pl.col("topic").is_in(list(self._topic_col)))
        user_row = {u: i for i, u in enumerate(affinity.get_column("user_id").unique().sort().to_list())}
        matrix = np.zeros((len(user_row) + 1, n_topics + 1), dtype=np.float32)
        rows = [user_row[u] for u in known.get_column("user_id").to_list()]
        cols = [self._topic_col[t] for t in known.get_column("topic").to_list()]
        matrix[rows, cols] = known.get_column("affinity").to_numpy().astype(np.float32)
        return user_row, matrix

    def features(self, user_id: str, item_ids: list[str], retrieval_scores: np.ndarray) -> np.ndarray:
        """Return the (len(item_ids), len(FEATURE_NAMES)) float32 feature matrix of one user's candidates."""
        default = len(self._items) - 1
        rows = np.fromiter((self._item_row.get(i, default) for i in item_ids), dtype=np.int64, count=len(item_ids))
        user = self._user_row.get(user_id, len(self._affinity) - 1)
        out = np.empty((len(item_ids), len(FEATURE_NAMES)), dtype=np.float32)
        out[:, 0] = retrieval_scores
        out[:, 1:3] = self._items[rows, :2]
        out[:, 3] = self._affinity[user, self._item_topic[rows]]
        out[:, 4] = self._items[rows, 2]
        return out


# --------------------------------------------------------------------------------------------
# Retrieval scores for training pairs
# --------------------------------------------------------------------------------------------


def interaction_weights(
    interactions: pl.DataFrame, now: datetime, event_weights: Mapping[str, float], half_life_days: float
) -> np.ndarray:
    """Return stage one's weight per interaction: event weight x 0.5 ** (age_days / half_life_days)."""
    weight = interaction_weight_expr(now, event_weights, half_life_days)
    return interactions.select(weight).get_column("weight").to_numpy().astype(np.float32)


def _history_rows(
    history: pl.DataFrame, users: list[str], item_index: dict[str, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (user rows, item rows, history positions) of the history of the given users over known items."""
    user_row = {u: i for i, u in enumerate(users)}
    pairs = zip(history.get_column("user_id").to_list(), history.get_column("item_id").to_list(), strict=True)
    kept = [(user_row[u], item_index[i], n) for n, (u, i) in enumerate(pairs) if u in user_row and i in item_index]
    if not kept:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows, cols, positions = (np.array(column, dtype=np.int64) for column in zip(*kept, strict=True))
    return rows, cols, positions


def _user_vectors(
    item_index: dict[str, int], vectors: torch.Tensor, history: pl.DataFrame, users: list[str], weights: np.ndarray
) -> torch.Tensor:
    """Return stage one's unit user vectors for users (rows in that order) from their history."""
    rows, cols, positions = _history_rows(history, users, item_index)
    return user_vectors(vectors, Interactions(rows, cols, weights[positions], len(users)))


def _vector_table(item_vectors: pl.DataFrame) -> tuple[dict[str, int], torch.Tensor]:
    """Return (item id -> row, unit item vectors) from an (item_id, embedding) frame."""
    index = {item: i for i, item in enumerate(item_vectors.get_column("item_id").to_list())}
    matrix = np.ascontiguousarray(item_vectors.get_column("embedding").to_numpy(), dtype=np.float32).reshape(len(index), -1)
    return index, torch.nn.functional.normalize(torch.from_numpy(matrix), p=2, dim=1)


def embedding_retrieval(item_vectors: pl.DataFrame, event_weights: Mapping[str, float], half_life_days: float) -> RetrievalFn:
    """Return a RetrievalFn computing stage one's cosine of user vector (from history) and item embedding.

    Pairs whose item has no embedding score 0.
    """
    index, vectors = _vector_table(item_vectors)

    def score(history: pl.DataFrame, pairs: pl.DataFrame, now: datetime) -> np.ndarray:
        users = pairs.get_column("user_id").unique().sort().to_list()
        weights = interaction_weights(history, now, event_weights, half_life_days)
        with torch.inference_mode():
            uvecs = _user_vectors(index, vectors, history, users, weights)
            user_row = {u: i for i, u in enumerate(users)}
            rows = torch.tensor([user_row[u] for u in pairs["user_id"].to_list()], dtype=torch.int64)
            cols = torch.tensor([index.get(i, -1) for i in pairs["item_id"].to_list()], dtype=torch.int64)
            cos = (uvecs[rows] * vectors[cols.clamp(min=0)]).sum(dim=1)
            return torch.where(cols >= 0, cos, torch.zeros_like(cos)).numpy().astype(np.float32)

    return score


def retrieval_candidates(
    item_vectors: pl.DataFrame, history: pl.DataFrame, now: datetime, k: int,
    event_weights: Mapping[str, float], half_life_days: float,
) -> pl.DataFrame:
    """Return stage one's top-k unseen items per user (user_id, rank, item_id, score) from item embeddings."""
    index, vectors = _vector_table(item_vectors)
    users = history.get_column("user_id").unique().sort().to_list()
    weights = interaction_weights(history, now, event_weights, half_life_days)
    uvecs = _user_vectors(index, vectors, history, users, weights)
    rows, cols, _ = _history_rows(history, users, index)
    seen = Interactions(rows, cols, np.ones(len(rows), dtype=np.float32), len(users))
    rows, scores = top_k_items(uvecs, vectors, seen, k, chunk=1024)
    table = candidates_table(np.array(users), np.array(list(index)), rows, scores)
    return table.with_columns(pl.col("score").cast(pl.Float32))


def hashed_text_vectors(items: pl.DataFrame, dim: int = 256) -> pl.DataFrame:
    """Return (item_id, embedding): unit TF-IDF vectors of title + body over crc32-hashed tokens.

    A stand-in for the encoder's embeddings in tests and demos; deterministic, no model needed.
    """
    texts = items.select((pl.col("title").fill_null("") + " " + pl.col("body").fill_null("")).str.to_lowercase())
    counts = np.zeros((items.height, dim), dtype=np.float32)
    for row, text in enumerate(texts.to_series().to_list()):
        hashes = [zlib.crc32(token.encode()) % dim for token in _TOKEN.findall(text)]
        np.add.at(counts[row], hashes, 1.0)
    idf = np.log((1.0 + items.height) / (1.0 + (counts > 0).sum(axis=0))) + 1.0
    vectors = np.log1p(counts) * idf
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return pl.DataFrame({"item_id": items.get_column("item_id"), "embedding": list(vectors)})


# --------------------------------------------------------------------------------------------
# Training examples and metrics
# --------------------------------------------------------------------------------------------


def default_cutoff(interactions: pl.DataFrame, quantile: float = 0.8) -> datetime:
    """Return the time split of training: the given quantile of interaction timestamps."""
    return interactions.select(pl.col("ts").quantile(quantile, interpolation="nearest")).item()


def _sample_negatives(
    positives: pl.DataFrame, interactions: pl.DataFrame, item_ids: list[str], per_positive: int, seed: int
) -> pl.DataFrame:
    """Return (user_id, item_id) pairs: per_positive x positives items per user the user never interacted with."""
    rng = np.random.default_rng(seed)
    all_items = np.array(sorted(item_ids))
    seen = interactions.group_by("user_id").agg(pl.col("item_id").unique()).sort("user_id")
    seen_of = dict(zip(seen["user_id"].to_list(), seen["item_id"].to_list(), strict=True))
    need = positives.group_by("user_id").agg(pl.len().alias("n")).sort("user_id")
    users, items = [], []
    for user, n in need.iter_rows():
        pool = np.setdiff1d(all_items, np.array(seen_of.get(user, []), dtype=all_items.dtype))
        picked = rng.choice(pool, size=min(n * per_positive, pool.size), replace=False)
        users += [user] * picked.size
        items += picked.tolist()
    return pl.DataFrame({"user_id": users, "item_id": items}, schema={"user_id": pl.String, "item_id": pl.String})


def training_examples(
    items: pl.DataFrame, interactions: pl.DataFrame, item_scores: pl.DataFrame, cutoff: datetime,
    retrieval_fn: RetrievalFn, negatives_per_positive: int = 4, seed: int = 0,
) -> pl.DataFrame:
    """Return labelled pairs (user_id, item_id, label, *FEATURE_NAMES) of users active before and after cutoff.

    Features use only interactions before cutoff; label 1 = the user's first interaction with the item is at
    or after cutoff; label 0 = sampled items the user never interacted with.
    """
    history, future = _before(interactions, cutoff), interactions.filter(pl.col("ts") >= pl.lit(cutoff))
    positives = (
        future.select("user_id", "item_id").unique()
        .join(history.select("user_id", "item_id").unique(), on=["user_id", "item_id"], how="anti")
        .join(history.select("user_id").unique(), on="user_id", how="semi")
    )
    negatives = _sample_negatives(positives, interactions, items.get_column("item_id").to_list(), negatives_per_positive, seed)
    labelled = [positives.with_columns(label=pl.lit(1, pl.Int8)), negatives.with_columns(label=pl.lit(0, pl.Int8))]
    pairs = pl.concat(labelled).sort("user_id", "item_id")
    pairs = pairs.with_columns(pl.Series("retrieval_score", retrieval_fn(history, pairs, cutoff), dtype=pl.Float64))
    table = item_features(items, history, item_scores, cutoff)
    return build_features(pairs, table, user_topic_affinity(history, table, cutoff))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Return the ROC AUC (Mann-Whitney, ties counted half); NaN without both classes."""
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = pl.Series(np.asarray(scores, dtype=np.float64)).rank("average").to_numpy()
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def mean_ndcg(users: np.ndarray, labels: np.ndarray, scores: np.ndarray, k: int = NDCG_K) -> float:
    """Return NDCG@k with binary relevance averaged over users with a positive (ties: lower row first)."""
    frame = pl.DataFrame({"user": users, "label": np.asarray(labels, np.float64), "score": np.asarray(scores, np.float64)})
    frame = frame.with_row_index("row").sort(["user", "score", "row"], descending=[False, True, False])
    gains = frame.with_columns(pos=pl.int_range(pl.len()).over("user")).filter(pl.col("pos") < k)
    discount = 1.0 / (pl.col("pos") + 2).cast(pl.Float64).log(2)
    dcg = gains.group_by("user").agg((pl.col("label") * discount).sum().alias("dcg"))
    ideal = frame.group_by("user").agg(pl.col("label").sum().alias("n_pos")).filter(pl.col("n_pos") > 0)
    idcg = pl.col("n_pos").map_elements(lambda n: _ideal_dcg(int(n), k), return_dtype=pl.Float64).alias("idcg")
    ideal = ideal.with_columns(idcg)
    joined = ideal.join(dcg, on="user", how="left")
    return float((joined["dcg"] / joined["idcg"]).mean()) if joined.height else float("nan")


def _ideal_dcg(n_pos: int, k: int) -> float:
    """Return the DCG@k of a list whose first n_pos items are relevant."""
    return float(sum(1.0 / np.log2(p + 2) for p in range(min(n_pos, k))))


def ranking_metrics(examples: pl.DataFrame, scores: np.ndarray) -> dict[str, float]:
    """Return AUC and NDCG@10 of the model's scores next to retrieval-only and popularity-only rankings."""
    users, labels = examples["user_id"].to_numpy(), examples["label"].to_numpy()
    baselines = {"retrieval": examples["retrieval_score"].to_numpy(), "popularity": examples["log_popularity"].to_numpy()}
    metrics = {"auc": auc(labels, scores), f"ndcg_at_{NDCG_K}": mean_ndcg(users, labels, scores)}
    for name, base in baselines.items():
        metrics[f"{name}_auc"] = auc(labels, base)
        metrics[f"{name}_ndcg_at_{NDCG_K}"] = mean_ndcg(users, labels, base)
    return {name: round(value, 4) for name, value in metrics.items()}


# --------------------------------------------------------------------------------------------
# Model, training, file
# --------------------------------------------------------------------------------------------


class RankerNet(torch.nn.Module):
    """Standardised features -> two hidden ReLU layers -> one logit."""

    def __init__(self, n_features: int, hidden: int, mean: torch.Tensor | None = None, std: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features) if mean is None else mean.float())
        self.register_buffer("std", torch.ones(n_features) if std is None else std.float())
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(n_features, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return one logit per row."""
        return self.mlp((x - self.mean) / self.std).squeeze(-1)


def ranker_version(net: RankerNet, feature_names: tuple[str, ...]) -> str:
    """Return the content hash of a ranker: feature names, shapes and every tensor's bytes."""
    digest = hashlib.sha256(json.dumps(list(feature_names)).encode())
    for name, tensor in sorted(net.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return f"ranker-{digest.hexdigest()[:16]}"


class RankerModel:
    """A trained ranker, loaded once and shared: score(features) -> one logit per row (higher ranks first)."""

    def __init__(
        self, net: RankerNet, feature_names: tuple[str, ...] = FEATURE_NAMES, metrics: dict[str, float] | None = None
    ) -> None:
        self.net = net.eval()
        self.feature_names = tuple(feature_names)
        self.hidden = int(net.mlp[0].out_features)
        self.metrics = dict(metrics or {})
        self.version = ranker_version(net, self.feature_names)
        self.training_info: dict[str, object] = {}

    def score(self, features: np.ndarray) -> np.ndarray:
        """Return float32 logits for a (rows, len(feature_names)) matrix.

        Raises:
            ValueError: the matrix has the wrong shape.
        """
        x = np.ascontiguousarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != len(self.feature_names):
            raise ValueError(f"need a (rows, {len(self.feature_names)}) feature matrix, got shape {x.shape}")
        with torch.inference_mode():
            return self.net(torch.from_numpy(x)).numpy().astype(np.float32, copy=False)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of train_ranker (defaults fit the demo data in about a second on a CPU)."""

    hidden: int = 32
    epochs: int = 20
    batch_size: int = 64
    learning_rate: float = 1e-2
    negatives_per_positive: int = 4
    holdout_share: float = 0.3
    seed: int = 0


def split_users(examples: pl.DataFrame, holdout_share: float, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return (train, held-out) examples split by user with a seeded permutation of the sorted user ids."""
    users = np.array(sorted(examples.get_column("user_id").unique().to_list()))
    held = set(np.random.default_rng(seed).permutation(users)[: round(len(users) * holdout_share)].tolist())
    mask = examples.get_column("user_id").is_in(list(held))
    return examples.filter(~mask), examples.filter(mask)


def fit_net(x: np.ndarray, y: np.ndarray, config: TrainConfig) -> RankerNet:
    """Return a RankerNet fitted with Adam on binary cross-entropy; deterministic for a seed and thread count."""
    features, labels = torch.from_numpy(x), torch.from_numpy(y.astype(np.float32))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        net = RankerNet(x.shape[1], config.hidden, features.mean(0), features.std(0).clamp(min=1e-6))
    optimiser = torch.optim.Adam(net.parameters(), lr=config.learning_rate)
    loss_fn, order_rng = torch.nn.BCEWithLogitsLoss(), np.random.default_rng(config.seed)
    for _ in range(config.epochs):
        for batch in np.array_split(order_rng.permutation(len(x)), max(1, len(x) // config.batch_size)):
            index = torch.from_numpy(batch)
            optimiser.zero_grad()
            loss_fn(net(features[index]), labels[index]).backward()
            optimiser.step()
    return net.eval()


def train_ranker(
    items: pl.DataFrame, interactions: pl.DataFrame, item_scores: pl.DataFrame, retrieval_fn: RetrievalFn,
    cutoff: datetime | None = None, config: TrainConfig = TrainConfig(),
) -> RankerModel:
    """Train the ranker on a time split of the log; its metrics compare it with retrieval alone on held-out users.

    Args:
        items: item_id, created_at.
        interactions: user_id, item_id, event, ts.
        item_scores: item_id, topic, topic_score.
        retrieval_fn: retrieval scores of the training pairs (embedding_retrieval in production).
        cutoff: the time split; default default_cutoff(interactions).
        config: hyper-parameters and seed.
    """
    cutoff = cutoff or default_cutoff(interactions)
    examples = training_examples(
        items, interactions, item_scores, cutoff, retrieval_fn, config.negatives_per_positive, config.seed
    )
    train, held_out = split_users(examples, config.holdout_share, config.seed)
    net = fit_net(feature_matrix(train), train.get_column("label").to_numpy(), config)
    model = RankerModel(net)
    metrics = ranking_metrics(held_out, model.score(feature_matrix(held_out)))
    model.metrics = {**metrics, "train_examples": train.height, "held_out_examples": held_out.height,
                     "held_out_users": held_out.get_column("user_id").n_unique()}
    model.training_info = {"cutoff": cutoff.isoformat(), **asdict(config)}
    log.info("trained %s: %s", model.version, metrics)
    return model


def metadata_path(path: Path) -> Path:
    """Return the JSON metadata file that sits next to a ranker's state-dict file."""
    return Path(path).with_suffix(".json")


def save_ranker(model: RankerModel, path: str | Path) -> Path:
    """Write the state dict to path and its metadata (version, features, metrics) to path.json; return path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.net.state_dict(), path)
    meta = {"format": RANKER_FORMAT, "version": model.version, "feature_names": list(model.feature_names),
            "hidden": model.hidden, "metrics": model.metrics, "training": model.training_info}
    metadata_path(path).write_text(json.dumps(meta, indent=2, sort_keys=True))
    log.info("saved ranker %s to %s", model.version, path)
    return path


def load_ranker(path: str | Path) -> RankerModel:
    """Return the ranker saved at path, checked against its recorded version.

    Raises:
        ModelLoadError: a file is missing or corrupt, of another format, or its content hash differs.
    """
    path = Path(path)
    try:
        meta = json.loads(metadata_path(path).read_text())
        names = tuple(meta["feature_names"])
        net = RankerNet(len(names), int(meta["hidden"]))
        net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"cannot load ranker {path}: {exc}") from exc
    if meta.get("format") != RANKER_FORMAT:
        raise ModelLoadError(f"ranker {path} has format {meta.get('format')!r}, expected {RANKER_FORMAT}")
    model = RankerModel(net, names, meta.get("metrics"))
    if model.version != meta.get("version"):
        raise ModelLoadError(f"ranker {path} content hash {model.version} differs from its metadata {meta.get('version')}")
    model.training_info = meta.get("training", {})
    return model
