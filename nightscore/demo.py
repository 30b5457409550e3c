"""Synthetic demo data: items with topical texts, and users whose interactions carry real catalogue structure.

Everything is deterministic per seed (no wall clock, no global random state): the same seed gives
identical frames. Texts mix per-topic vocabularies with common words and have a long-tailed token
length; the text and the topic are the ONLY things an item row says about it.

Hidden structure (drawn per seed, never written into the item rows; the item ids are in random order
with respect to it):
- series: items of one topic consumed in order (episode after episode);
- bundles: small cross-topic groups of complements consumed together;
- taste clusters: about 40 items each, mostly of one topic; each user favours one to three;
- popularity: Zipf-like within each topic and within each cluster;
- new items: a share created in the last NEW_ITEM_DAYS days, interacted with only after creation
  (the newest have no interaction at all); a share of users has only one or two interactions.
A user's interactions come in sessions: an anchor (from a favourite cluster, or a preferred topic by
popularity), then with probability CONTINUE_PROB the next episode of the previous item's series or a
member of its bundle, within minutes; a new session starts days later, and with probability RESUME_PROB
it resumes the series of the previous item (its next episode) instead of drawing an anchor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import polars as pl

from storage.lake import Lake

logger = logging.getLogger(__name__)

DEMO_BASE_TIME: datetime = datetime(2026, 11, 1, tzinfo=UTC)
"""Fixed "now" of the demo data; every generated timestamp lies before it."""

EVENTS: tuple[str, ...] = ("view", "click", "purchase")
EVENT_PROBS: tuple[float, ...] = (0.85, 0.12, 0.03)

# Keys must match core.settings.DEFAULT_TOPIC_LABELS (checked by the unit tests).
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
ZIPF_EXPONENT = 1.25
INTERACTIONS_MEDIAN = 14.0
INTERACTIONS_MAX = 300
MIN_INTERACTIONS = 1
THIN_USER_SHARE = 0.1  # users with one or two interactions
NEW_ITEM_SHARE = 0.06
NEW_ITEM_DAYS = 21
CLUSTER_SIZE = 40
CLUSTER_TOPIC_SHARE = 0.7  # share of a cluster's items from its main topic
CLUSTER_ANCHOR_PROB = 0.45  # a session starts in a favourite cluster (else: preferred topic by popularity)
CONTINUE_PROB = 0.55  # the next interaction continues the session
RESUME_PROB = 0.35  # a new session resumes the previous item's series (the next episode, days later)
SERIES_PROB = 0.6  # a continuation follows the series (else: the bundle)
SERIES_MEAN_EXTRA = 2.5  # series size = 1 + Poisson(this)
BUNDLE_SIZES = (2, 5)  # bundle sizes drawn from [low, high)
TEXT_CHUNK = 65_536  # items per text-generation chunk (bounded memory at a million items)

_US_PER_S = 1_000_000
_US_PER_DAY = 86_400 * _US_PER_S


def topics() -> tuple[str, ...]:
    """Return the topic names in their fixed order."""
    return tuple(TOPIC_WORDS)


def epoch_us(moment: datetime) -> int:
    """Return a timezone-aware datetime as integer microseconds since the Unix epoch."""
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // datetime.resolution


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


def _series_names(series: np.ndarray, named: np.ndarray, seed: int) -> np.ndarray:
    """Return two made-up name words per item of a named series ("" for the others), equal within a series."""
    syllables = np.array([c + v for c in "bdfgklmnprstvz" for v in "aeiou"])
    ids, inverse = np.unique(series, return_inverse=True)
    rng = np.random.default_rng([seed, 3])
    parts = syllables[rng.integers(0, syllables.size, (ids.size, 5))]
    first = np.char.add(np.char.add(parts[:, 0], parts[:, 1]), parts[:, 2])
    names = np.char.add(np.char.add(first, " "), np.char.add(parts[:, 3], parts[:, 4]))[inverse.reshape(-1)]
    return np.where(named, np.char.add(names, " "), "")


def titles(rng: np.random.Generator, topic_idx: np.ndarray, prefixes: np.ndarray | None = None) -> list[str | None]:
    """Return one short, mostly topical, title-cased title per item (after its series name); a few are null."""
    counts = rng.integers(3, 9, topic_idx.size)
    words = _draw_words(rng, topic_idx, counts, TITLE_TOPIC_SHARE, 0.0)
    texts = _join_words(words, counts)
    if prefixes is not None:
        texts = [prefix + text for prefix, text in zip(prefixes.tolist(), texts, strict=True)]
    titles = [text.title() for text in texts]
    null = rng.random(topic_idx.size) < NULL_TITLE_SHARE
    return [None if is_null else title for title, is_null in zip(titles, null, strict=True)]


def bodies(rng: np.random.Generator, topic_idx: np.ndarray) -> list[str]:
    """Return one body per item with a log-normal word count and sentences ending in full stops."""
    median = np.log(BODY_WORDS_MEDIAN)
    counts = np.clip(np.rint(rng.lognormal(median, BODY_WORDS_SIGMA, topic_idx.size)), 3, BODY_WORDS_MAX)
    counts = counts.astype(np.int64)
    words = _draw_words(rng, topic_idx, counts, BODY_TOPIC_SHARE, BODY_NOISE_SHARE)
    sentence_end = rng.random(words.size) < SENTENCE_END_PROB
    sentence_end[np.cumsum(counts) - 1] = True
    return _join_words(np.where(sentence_end, np.char.add(words, "."), words), counts)


def generate_items(n_items: int = 2000, seed: int = 0) -> pl.DataFrame:
    """Return ``n_items`` items: item_id, title, body, created_at (UTC) and topic.

    Most items were created 91-365 days before the base time; NEW_ITEM_SHARE of them in its last
    NEW_ITEM_DAYS days. Texts are drawn in chunks of TEXT_CHUNK items, each from its own seeded stream;
    the items of one series share a made-up two-word name at the start of their title, as episodes of a
    real series share its name (the only trace of the hidden structure in an item row).
    """
    rng = np.random.default_rng([seed, 0])
    topic_idx = rng.integers(0, len(TOPIC_WORDS), n_items)
    age_us = rng.integers(91 * _US_PER_DAY, 365 * _US_PER_DAY, n_items)
    new = rng.random(n_items) < NEW_ITEM_SHARE
    age_us[new] = rng.integers(0, NEW_ITEM_DAYS * _US_PER_DAY, int(new.sum()))
    created_s = (epoch_us(DEMO_BASE_TIME) - age_us) // _US_PER_S * _US_PER_S
    structure = _structure(np.random.default_rng([seed, 2]), topic_idx)
    named = np.bincount(structure.series)[structure.series] > 1
    prefixes = _series_names(structure.series, named, seed)
    item_titles: list[str | None] = []
    item_bodies: list[str] = []
    for n, start in enumerate(range(0, n_items, TEXT_CHUNK)):
        text_rng = np.random.default_rng([seed, 0, n])
        part = slice(start, start + TEXT_CHUNK)
        item_titles += titles(text_rng, topic_idx[part], prefixes[part])
        item_bodies += bodies(text_rng, topic_idx[start : start + TEXT_CHUNK])
    numbers = pl.Series(np.arange(1, n_items + 1)).cast(pl.String).str.zfill(6)
    return pl.DataFrame(
        [
            ("item-" + numbers).alias("item_id"),
            pl.Series("title", item_titles, dtype=pl.String),
            pl.Series("body", item_bodies, dtype=pl.String),
            _to_datetime("created_at", created_s),
            pl.Series("topic", np.array(topics())[topic_idx].tolist(), dtype=pl.String),
        ]
    )


def _popularity_cdf(
    rng: np.random.Generator, topic_idx: np.ndarray, n_groups: int = len(TOPIC_WORDS), item_weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return items ordered by group and a CDF that rises from g to g + 1 over group g.

    Within a group the weights are Zipf over a random order, or the given per-item weights.
    """
    key = rng.random(topic_idx.size) if item_weights is None else -item_weights
    order = np.lexsort((key, topic_idx))
    sorted_topics = topic_idx[order]
    starts = np.searchsorted(sorted_topics, sorted_topics, side="left")
    weights = 1.0 / (np.arange(topic_idx.size) - starts + 1.0) ** ZIPF_EXPONENT if item_weights is None else item_weights[order]
    totals = np.bincount(sorted_topics, weights=weights, minlength=n_groups)
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


def _user_timestamps(rng: np.random.Generator, counts: np.ndarray, continues: np.ndarray) -> np.ndarray:
    """Return epoch-us timestamps in whole seconds, distinct per user: a 3-90 day span ending at the user's last activity.

    The last activity lies an exponential time (mean 7 days, at most 60) before the base time; gaps are
    exponential, short (minutes) inside a session and long between sessions.
    """
    span_s = np.repeat(rng.integers(3 * 86_400, 90 * 86_400, counts.size) - counts, counts)
    gaps = rng.exponential(1.0, counts.sum()) * np.where(continues, 0.002, 1.0)
    elapsed = _within_group_cumsum(gaps, counts)
    frac = elapsed / np.repeat(elapsed[np.cumsum(counts) - 1], counts)
    position = _within_group_cumsum(np.ones(counts.sum(), dtype=np.int64), counts)
    # floor() never decreases and position strictly increases, so times strictly increase within a user.
    offset_s = np.floor((1.0 - frac) * span_s).astype(np.int64) + (counts.repeat(counts) - position)
    last_s = np.minimum(rng.exponential(7 * 86_400, counts.size), 60 * 86_400).astype(np.int64)  # last activity
    offset_s += np.repeat(last_s, counts)
    return epoch_us(DEMO_BASE_TIME) - offset_s * _US_PER_S


def _interaction_counts(rng: np.random.Generator, n_users: int, median: float) -> np.ndarray:
    """Return a long-tailed number of interactions per user; THIN_USER_SHARE of the users have one or two."""
    cap = max(INTERACTIONS_MAX, int(20 * median))
    counts = np.clip(np.rint(rng.lognormal(np.log(median), 0.8, n_users)).astype(np.int64), 3, cap)
    thin = rng.random(n_users) < THIN_USER_SHARE
    counts[thin] = rng.integers(MIN_INTERACTIONS, 3, int(thin.sum()))
    return counts


@dataclass(frozen=True)
class _Structure:
    """The hidden structure of a catalogue: series successor, bundles, clusters (item rows)."""

    series_next: np.ndarray
    series: np.ndarray
    bundle_order: np.ndarray
    bundle_start: np.ndarray
    bundle_size: np.ndarray
    bundle_pos: np.ndarray
    cluster: np.ndarray
    n_clusters: int
    appeal: np.ndarray


def _cut(rng: np.random.Generator, n: int, sizes: np.ndarray) -> np.ndarray:
    """Return a group id per position for n consecutive positions cut into groups of the given sizes."""
    ends = np.cumsum(sizes)
    return np.searchsorted(ends, np.arange(n), side="right")


def _structure(rng: np.random.Generator, topic_idx: np.ndarray) -> _Structure:
    """Return the hidden series, bundles and clusters of the items."""
    n = topic_idx.size
    order = np.lexsort((rng.random(n), topic_idx))  # items by topic, random within a topic
    series = _cut(rng, n, 1 + rng.poisson(SERIES_MEAN_EXTRA, n)) * len(TOPIC_WORDS) + topic_idx[order]
    same = np.r_[series[1:] == series[:-1], False]
    series_next = np.full(n, -1, dtype=np.int64)
    series_next[order[same]] = order[np.flatnonzero(same) + 1]
    series_of = np.empty(n, dtype=np.int64)
    series_of[order] = series
    bundle_order = rng.permutation(n)
    bundle = _cut(rng, n, rng.integers(*BUNDLE_SIZES, n))
    first = np.searchsorted(bundle, bundle)
    size = np.bincount(bundle)[bundle]
    start, pos, sz = (np.empty(n, dtype=np.int64) for _ in range(3))
    start[bundle_order], pos[bundle_order], sz[bundle_order] = first, np.arange(n) - first, size
    per_topic = max(1, n // (CLUSTER_SIZE * len(TOPIC_WORDS)))
    cluster = np.where(
        rng.random(n) < CLUSTER_TOPIC_SHARE,
        topic_idx + len(TOPIC_WORDS) * rng.integers(0, per_topic, n),
        rng.integers(0, per_topic * len(TOPIC_WORDS), n),
    )
    # an item's appeal: Zipf over its rank within its topic; popular items are popular in their cluster too
    in_topic = np.lexsort((rng.random(n), topic_idx))
    rank = np.empty(n, dtype=np.int64)
    rank[in_topic] = np.arange(n) - np.searchsorted(topic_idx[in_topic], topic_idx[in_topic])
    appeal = 1.0 / (rank + 1.0) ** ZIPF_EXPONENT
    return _Structure(series_next, series_of, bundle_order, start, sz, pos, cluster, per_topic * len(TOPIC_WORDS), appeal)


def _bundle_partner(rng: np.random.Generator, s: _Structure, items: np.ndarray) -> np.ndarray:
    """Return another member of each item's bundle (-1 for a bundle of one)."""
    size = s.bundle_size[items]
    step = 1 + np.floor(rng.random(items.size) * np.maximum(size - 1, 1)).astype(np.int64)
    partner = s.bundle_order[s.bundle_start[items] + (s.bundle_pos[items] + step) % size]
    return np.where(size > 1, partner, -1)


def _anchors(rng: np.random.Generator, topic_idx: np.ndarray, s: _Structure, user: np.ndarray, n_users: int) -> np.ndarray:
    """Return one session-anchor item per interaction: from a favourite cluster, or a preferred topic."""
    by_topic = _sample_items(rng, topic_idx, user, n_users)
    per_topic = s.n_clusters // len(TOPIC_WORDS)
    favourites = rng.integers(0, per_topic, (n_users, 3)) * len(TOPIC_WORDS) + _favourite_topics(rng, topic_idx, n_users)
    n_favourite = rng.integers(1, 4, n_users)
    pick = np.floor(rng.random(user.size) * n_favourite[user]).astype(np.int64)
    chosen = favourites[user, pick]
    order, cdf = _popularity_cdf(rng, s.cluster, s.n_clusters, s.appeal)
    present = np.bincount(s.cluster, minlength=s.n_clusters) > 0
    chosen = np.where(present[chosen], chosen, s.cluster[by_topic])
    by_cluster = order[np.minimum(np.searchsorted(cdf, chosen + rng.uniform(1e-12, 1.0, user.size)), cdf.size - 1)]
    return np.where(rng.random(user.size) < CLUSTER_ANCHOR_PROB, by_cluster, by_topic)


def _favourite_topics(rng: np.random.Generator, topic_idx: np.ndarray, n_users: int) -> np.ndarray:
    """Return (n_users, 3) topics of the users' favourite clusters (drawn from a topic-preference mix)."""
    present = np.bincount(topic_idx, minlength=len(TOPIC_WORDS)) > 0
    cdf = np.cumsum(_user_preferences(rng, n_users, present), axis=1)
    draws = (rng.random((n_users, 3))[:, :, None] > cdf[:, None, :-1]).sum(axis=2)
    return np.where(present[draws], draws, np.argmax(present))


def _sample_items(rng: np.random.Generator, topic_idx: np.ndarray, user: np.ndarray, n_users: int) -> np.ndarray:
    """Return one item row index per interaction: a topic from the user's preferences, then an item by popularity."""
    present = np.bincount(topic_idx, minlength=len(TOPIC_WORDS)) > 0
    order, cdf = _popularity_cdf(rng, topic_idx)
    prefs = _user_preferences(rng, n_users, present)
    topic_cdf = np.cumsum(prefs, axis=1)
    chosen_topic = (rng.random(user.size)[:, None] > topic_cdf[user, :-1]).sum(axis=1)
    chosen_topic = np.where(present[chosen_topic], chosen_topic, np.argmax(present))  # float-error guard
    target = chosen_topic + rng.uniform(1e-12, 1.0, user.size)
    return order[np.minimum(np.searchsorted(cdf, target, side="left"), cdf.size - 1)]


def _follow_sessions(
    rng: np.random.Generator, s: _Structure, anchors: np.ndarray, continues: np.ndarray, resumes: np.ndarray
) -> np.ndarray:
    """Return the items: anchors, where a row continues its session the series successor or a bundle partner.

    A row that resumes (a new session) takes the series successor of the previous item only.
    """
    items = anchors.copy()
    follows = continues | resumes
    run_start = np.maximum.accumulate(np.where(~follows, np.arange(items.size), 0))
    depth = np.arange(items.size) - run_start
    series = (rng.random(items.size) < SERIES_PROB) | resumes
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(1, int(depth.max(initial=0)) + 2))
    for d in range(len(bounds) - 1):
        rows = by_depth[bounds[d] : bounds[d + 1]]
        prev = items[rows - 1]
        partner = _bundle_partner(rng, s, prev)
        partner = np.where(resumes[rows], -1, partner)
        nxt = np.where(series[rows] & (s.series_next[prev] >= 0), s.series_next[prev], partner)
        items[rows] = np.where(nxt >= 0, nxt, items[rows])
    return items


def _respect_creation(
    rng: np.random.Generator,
    items: pl.DataFrame,
    item_row: np.ndarray,
    ts_us: np.ndarray,
    topic_idx: np.ndarray,
    user: np.ndarray,
    n_users: int,
) -> np.ndarray:
    """Return item rows where every interaction before its item's creation is redrawn among older items."""
    created = items.get_column("created_at").dt.epoch("us").to_numpy()
    bad = np.flatnonzero(created[item_row] > ts_us)
    oldest = int(np.argmin(created))
    for _ in range(4):
        if bad.size == 0:
            break
        item_row[bad] = _sample_items(rng, topic_idx, user[bad], n_users)
        bad = bad[created[item_row[bad]] > ts_us[bad]]
    item_row[bad] = oldest
    return item_row


def generate_interactions(
    items: pl.DataFrame, n_users: int = 500, seed: int = 0, median_interactions: float = INTERACTIONS_MEDIAN
) -> pl.DataFrame:
    """Return interactions (user_id, item_id, event, ts) of ``n_users`` users, sorted by user_id and ts."""
    rng = np.random.default_rng([seed, 1])
    counts = _interaction_counts(rng, n_users, median_interactions)
    user = np.repeat(np.arange(n_users), counts)
    first = np.r_[0, np.cumsum(counts)[:-1]]
    continues = rng.random(user.size) < CONTINUE_PROB
    continues[first] = False
    resumes = ~continues & (rng.random(user.size) < RESUME_PROB)
    resumes[first] = False
    topic_idx = items["topic"].replace_strict(list(topics()), list(range(len(TOPIC_WORDS)))).to_numpy()
    structure = _structure(np.random.default_rng([seed, 2]), topic_idx)
    item_row = _follow_sessions(rng, structure, _anchors(rng, topic_idx, structure, user, n_users), continues, resumes)
    ts = _user_timestamps(rng, counts, continues)
    item_row = _respect_creation(rng, items, item_row, ts, topic_idx, user, n_users)
    events = rng.choice(len(EVENTS), size=user.size, p=EVENT_PROBS)
    numbers = pl.Series(user + 1).cast(pl.String).str.zfill(5)
    frame = pl.DataFrame(
        [
            ("user-" + numbers).alias("user_id"),
            items.get_column("item_id").gather(item_row).alias("item_id"),
            pl.Series("event", np.array(EVENTS)[events].tolist(), dtype=pl.String),
            _to_datetime("ts", ts),
        ]
    )
    return frame.sort("user_id", "ts")


def generate_demo_data(
    n_items: int = 2000, n_users: int = 500, seed: int = 0, median_interactions: float = INTERACTIONS_MEDIAN
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Return the demo (items, interactions) frames for one seed."""
    items = generate_items(n_items, seed)
    interactions = generate_interactions(items, n_users, seed, median_interactions)
    logger.info("generated %d items and %d interactions (seed %d)", items.height, interactions.height, seed)
    return items, interactions


DEMO_ITEMS, DEMO_USERS, DEMO_SEED = 2000, 500, 0


def ensure_demo_inputs(
    lake: Lake, n_items: int = DEMO_ITEMS, n_users: int = DEMO_USERS, seed: int = DEMO_SEED
) -> tuple[str, str]:
    """Return (items URI, interactions URI) of the demo inputs in the lake (inputs/demo/), generating them if absent."""
    items_uri, inter_uri = lake.uri("inputs", "demo", "items.parquet"), lake.uri("inputs", "demo", "interactions.parquet")
    if not (lake.exists(items_uri) and lake.exists(inter_uri)):
        items, interactions = generate_demo_data(n_items, n_users, seed)
        lake.write_parquet(items, items_uri)
        lake.write_parquet(interactions, inter_uri)
        logger.info("wrote demo inputs: %d items, %d interactions", items.height, interactions.height)
    return items_uri, inter_uri
