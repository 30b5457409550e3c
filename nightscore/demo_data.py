"""Synthetic demo data: items with topical texts and users whose interactions follow topic preferences.

Everything is deterministic per seed (no wall clock, no global random state): the same seed gives
identical frames. Texts mix per-topic vocabularies with common words and have a long-tailed token
length, item popularity is Zipf-like within each topic, and each user prefers one to three topics.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import numpy as np
import polars as pl

logger = logging.getLogger(__name__)

DEMO_BASE_TIME: datetime = datetime(2026, 11, 1, tzinfo=timezone.utc)
"""Fixed "now" of the demo data; every generated timestamp lies before it."""

EVENTS: tuple[str, ...] = ("view", "click", "purchase")
EVENT_PROBS: tuple[float, ...] = (0.85, 0.12, 0.03)

# Keys must match nightscore.settings.DEFAULT_TOPIC_LABELS (checked by the unit tests).
TOPIC_WORDS: dict[str, str] = {
    "sports": "football soccer basketball tennis golf hockey baseball cricket rugby athlete athletes team teams "
    "coach player players match matches league season championship tournament stadium goal goals score scored "
    "referee striker goalkeeper olympic medal race marathon sprint fans playoff victory defeat champion transfer trophy",
    "politics": "election elections vote voters ballot campaign candidate parliament senate congress government "
    "minister president policy policies law legislation party parties opposition coalition democracy democratic "
    "republican senator governor mayor cabinet reform debate referendum constitution diplomat embassy treaty "
    "sanctions protest lobby bill",
    "technology": "software hardware computer computers chip chips processor internet network cloud server servers "
    "data algorithm code programming developer developers app apps smartphone laptop startup robot robots "
    "artificial intelligence digital online cyber security encryption browser database silicon quantum wireless "
    "gadget device devices",
    "cooking": "recipe recipes cooking kitchen chef bake baking oven flour sugar butter garlic onion tomato sauce soup "
    "pasta rice bread dough salad spice spices roast grill pan fry dessert cake chocolate cheese dinner lunch "
    "breakfast ingredients vegetables meat chicken restaurant",
    "travel": "travel tourism tourist tourists flight flights airport airline hotel hotels resort beach island "
    "destination destinations passport visa luggage trip journey vacation holiday cruise backpacking itinerary "
    "sightseeing museum tour guide booking hostel train adventure abroad mountains coast villa landmark",
    "finance": "finance financial market markets stock stocks shares investor investors bank banks banking economy "
    "economic inflation interest rates bond bonds dividend portfolio fund funds trading trader profit revenue "
    "earnings loan loans mortgage credit debt currency dollar budget tax taxes",
    "health": "health medical medicine doctor doctors nurse hospital patient patients disease diseases vaccine "
    "vaccines virus infection symptoms treatment therapy diagnosis surgery cancer diabetes heart blood fitness "
    "exercise diet nutrition sleep mental clinic pharmacy drug drugs immune wellness injury",
    "music": "music song songs album albums band bands concert concerts guitar piano drums singer singers lyrics "
    "melody rhythm chorus orchestra symphony jazz rock pop hip hop rap festival charts vinyl record studio "
    "musician musicians composer tune tunes playlist stage",
}
COMMON_WORDS: str = (
    "the a an of to and in on for with at by from about as into over after before during this that these those "
    "it its they their we our you your he she his her new first last more most some many other people year years "
    "time day week today report says said could would will can may also just very still only world city country "
    "local best way part life work group story news while where when"
)

# Text shape, calibrated against the all-MiniLM-L6-v2 tokenizer (see the unit tests).
BODY_WORDS_MEDIAN = 28.0
BODY_WORDS_SIGMA = 1.2
BODY_WORDS_MAX = 1000
BODY_TOPIC_SHARE = 0.35
BODY_NOISE_SHARE = 0.04
TITLE_TOPIC_SHARE = 0.7
SENTENCE_END_PROB = 0.09
NULL_TITLE_SHARE = 0.01

# Behaviour shape.
PREFERRED_SHARE = 0.8
ZIPF_EXPONENT = 1.1
INTERACTIONS_MEDIAN = 14.0
INTERACTIONS_MAX = 300
MIN_INTERACTIONS = 3

_US_PER_S = 1_000_000
_US_PER_DAY = 86_400 * _US_PER_S


def topics() -> tuple[str, ...]:
    """Return the topic names in their fixed order."""
    return tuple(TOPIC_WORDS)


def _epoch_us(moment: datetime) -> int:
    """Return a timezone-aware datetime as integer microseconds since the Unix epoch."""
    return (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // datetime.resolution


def _to_datetime(name: str, epoch_us: np.ndarray) -> pl.Series:
    """Return epoch microseconds as a Datetime("us", "UTC") series."""
    return pl.Series(name, epoch_us.astype(np.int64)).cast(pl.Datetime("us", "UTC"))


def _draw_words(
    rng: np.random.Generator, topic_idx: np.ndarray, counts: np.ndarray, topic_share: float, noise_share: float
) -> np.ndarray:
    """Return a flat array of ``counts.sum()`` words: own-topic, random-topic (noise) or common words."""
    vocabs = [np.array(words.split()) for words in TOPIC_WORDS.values()]
    sizes = np.array([len(v) for v in vocabs])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat_topic, common = np.concatenate(vocabs), np.array(COMMON_WORDS.split())
    word_topic = np.repeat(topic_idx, counts)
    kind = rng.random(word_topic.size)
    noise = kind >= 1.0 - noise_share
    word_topic = np.where(noise, rng.integers(0, len(vocabs), word_topic.size), word_topic)
    topical = np.floor(rng.random(word_topic.size) * sizes[word_topic]).astype(np.int64) + offsets[word_topic]
    commons = rng.integers(0, common.size, word_topic.size)
    return np.where((kind < topic_share) | noise, flat_topic[topical], common[commons])


def _join_words(words: np.ndarray, counts: np.ndarray) -> list[str]:
    """Return one space-joined string per item from a flat word array split by ``counts``."""
    return [" ".join(chunk) for chunk in np.split(words, np.cumsum(counts)[:-1])]


def _titles(rng: np.random.Generator, topic_idx: np.ndarray) -> list[str | None]:
    """Return one short, mostly topical, title-cased title per item; a few are null."""
    counts = rng.integers(3, 9, topic_idx.size)
    words = _draw_words(rng, topic_idx, counts, TITLE_TOPIC_SHARE, 0.0)
    titles = [text.title() for text in _join_words(words, counts)]
    null = rng.random(topic_idx.size) < NULL_TITLE_SHARE
    return [None if is_null else title for title, is_null in zip(titles, null, strict=True)]


def _bodies(rng: np.random.Generator, topic_idx: np.ndarray) -> list[str]:
    """Return one body per item with a log-normal word count and sentences ending in full stops."""
    median = np.log(BODY_WORDS_MEDIAN)
    counts = np.clip(np.rint(rng.lognormal(median, BODY_WORDS_SIGMA, topic_idx.size)), 3, BODY_WORDS_MAX)
    counts = counts.astype(np.int64)
    words = _draw_words(rng, topic_idx, counts, BODY_TOPIC_SHARE, BODY_NOISE_SHARE)
    sentence_end = rng.random(words.size) < SENTENCE_END_PROB
    sentence_end[np.cumsum(counts) - 1] = True
    return _join_words(np.where(sentence_end, np.char.add(words, "."), words), counts)


def generate_items(n_items: int = 2000, seed: int = 0) -> pl.DataFrame:
    """Return ``n_items`` items: item_id, title, body, created_at (UTC, 91-365 days before base) and topic."""
    rng = np.random.default_rng([seed, 0])
    topic_idx = rng.integers(0, len(TOPIC_WORDS), n_items)
    age_us = rng.integers(91 * _US_PER_DAY, 365 * _US_PER_DAY, n_items)
    created_s = (_epoch_us(DEMO_BASE_TIME) - age_us) // _US_PER_S * _US_PER_S
    return pl.DataFrame(
        [
            pl.Series("item_id", [f"item-{i:06d}" for i in range(1, n_items + 1)], dtype=pl.String),
            pl.Series("title", _titles(rng, topic_idx), dtype=pl.String),
            pl.Series("body", _bodies(rng, topic_idx), dtype=pl.String),
            _to_datetime("created_at", created_s),
            pl.Series("topic", np.array(topics())[topic_idx].tolist(), dtype=pl.String),
        ]
    )


def _popularity_cdf(rng: np.random.Generator, topic_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return items ordered by topic and a CDF that rises from t to t + 1 over topic t (Zipf within topic)."""
    order = np.lexsort((rng.random(topic_idx.size), topic_idx))
    sorted_topics = topic_idx[order]
    starts = np.searchsorted(sorted_topics, sorted_topics, side="left")
    weights = 1.0 / (np.arange(topic_idx.size) - starts + 1.0) ** ZIPF_EXPONENT
    totals = np.bincount(sorted_topics, weights=weights, minlength=len(TOPIC_WORDS))
    within = np.cumsum(weights) - np.concatenate([[0.0], np.cumsum(totals)])[sorted_topics]
    cdf = sorted_topics + within / totals[sorted_topics]
    ends = np.searchsorted(sorted_topics, sorted_topics, side="right") - 1
    cdf[ends] = sorted_topics[ends] + 1.0  # exact topic boundaries, so float error never spills over
    return order, cdf


def _user_preferences(rng: np.random.Generator, n_users: int, present: np.ndarray) -> np.ndarray:
    """Return an (n_users, n_topics) matrix of topic probabilities: 1-3 preferred topics plus uniform rest."""
    n_topics = len(TOPIC_WORDS)
    n_preferred = np.minimum(rng.integers(1, 4, n_users), present.sum())
    scores = np.where(present, rng.random((n_users, n_topics)), -1.0)
    ranks = np.argsort(np.argsort(-scores, axis=1), axis=1)
    preferred = (ranks < n_preferred[:, None]) * rng.dirichlet(np.full(n_topics, 2.0), n_users)
    preferred /= preferred.sum(axis=1, keepdims=True)
    return PREFERRED_SHARE * preferred + (1.0 - PREFERRED_SHARE) * present / present.sum()


def _within_group_cumsum(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Return the running sum of ``values`` restarted at each group of ``counts`` consecutive rows."""
    cum = np.cumsum(values)
    ends = np.cumsum(counts) - 1
    return cum - np.repeat(np.concatenate([[0], cum[ends[:-1]]]), counts)


def _user_timestamps(rng: np.random.Generator, counts: np.ndarray) -> np.ndarray:
    """Return epoch-us timestamps in whole seconds, within each user's last 3-90 days and distinct per user."""
    span_s = np.repeat(rng.integers(3 * 86_400, 90 * 86_400, counts.size) - counts, counts)
    elapsed = _within_group_cumsum(rng.exponential(1.0, counts.sum()), counts)
    frac = elapsed / np.repeat(elapsed[np.cumsum(counts) - 1], counts)
    position = _within_group_cumsum(np.ones(counts.sum(), dtype=np.int64), counts)
    # floor() never decreases and position strictly increases, so offsets strictly increase within a user.
    offset_s = np.floor(frac * span_s).astype(np.int64) + position
    return _epoch_us(DEMO_BASE_TIME) - offset_s * _US_PER_S


def _interaction_counts(rng: np.random.Generator, n_users: int) -> np.ndarray:
    """Return a long-tailed number of interactions per user, at least MIN_INTERACTIONS."""
    counts = np.rint(rng.lognormal(np.log(INTERACTIONS_MEDIAN), 0.8, n_users)).astype(np.int64)
    return np.clip(counts, MIN_INTERACTIONS, INTERACTIONS_MAX)


def _sample_items(rng: np.random.Generator, items: pl.DataFrame, user: np.ndarray, n_users: int) -> np.ndarray:
    """Return one item row index per interaction: a topic from the user's preferences, then an item by popularity."""
    topic_idx = items["topic"].replace_strict(list(topics()), list(range(len(TOPIC_WORDS)))).to_numpy()
    present = np.bincount(topic_idx, minlength=len(TOPIC_WORDS)) > 0
    order, cdf = _popularity_cdf(rng, topic_idx)
    prefs = _user_preferences(rng, n_users, present)
    topic_cdf = np.cumsum(prefs, axis=1)
    chosen_topic = (rng.random(user.size)[:, None] > topic_cdf[user, :-1]).sum(axis=1)
    chosen_topic = np.where(present[chosen_topic], chosen_topic, np.argmax(present))  # float-error guard
    target = chosen_topic + rng.uniform(1e-12, 1.0, user.size)
    return order[np.minimum(np.searchsorted(cdf, target, side="left"), cdf.size - 1)]


def generate_interactions(items: pl.DataFrame, n_users: int = 500, seed: int = 0) -> pl.DataFrame:
    """Return interactions (user_id, item_id, event, ts) of ``n_users`` users, sorted by user_id and ts."""
    rng = np.random.default_rng([seed, 1])
    counts = _interaction_counts(rng, n_users)
    user = np.repeat(np.arange(n_users), counts)
    item_row = _sample_items(rng, items, user, n_users)
    events = rng.choice(len(EVENTS), size=user.size, p=EVENT_PROBS)
    user_ids = np.array([f"user-{i:05d}" for i in range(1, n_users + 1)])
    frame = pl.DataFrame(
        [
            pl.Series("user_id", user_ids[user].tolist(), dtype=pl.String),
            pl.Series("item_id", items["item_id"].to_numpy()[item_row].tolist(), dtype=pl.String),
            pl.Series("event", np.array(EVENTS)[events].tolist(), dtype=pl.String),
            _to_datetime("ts", _user_timestamps(rng, counts)),
        ]
    )
    return frame.sort("user_id", "ts")


def generate_demo_data(n_items: int = 2000, n_users: int = 500, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return the demo (items, interactions) frames for one seed."""
    items = generate_items(n_items, seed)
    interactions = generate_interactions(items, n_users, seed)
    logger.info("generated %d items and %d interactions (seed %d)", items.height, interactions.height, seed)
    return items, interactions
