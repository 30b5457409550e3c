"""Static int8 quantisations of one model that share its calibration statistics (NNCF collects them once).

The int8 search quantises one model some twenty times, each with other operations kept float. Collecting NNCF's
statistics (the calibration texts through the model, once per pipeline step) was about 8 s of each trial's 14 s.
Here the steps before the last (SmoothQuant) run once with nothing ignored: in float, smoothing is an identity
(x/s times sW), so a MatMul kept float loses nothing by it. The last step's statistics (MinMax quantisation and
bias correction) are collected once on the smoothed model, and each trial runs only that step with them, the way
NNCF's own hyperparameter tuner shares statistics between its pipelines. A trial that needs statistics at points
not yet collected (keeping one of Q/K/V float splits their shared input quantizer into one per consumer) has
just those collected and added; one that needs other statistics at a collected point gets its own collection.
Either way a trial's model equals what a fresh NNCF pipeline makes of the smoothed model.

NNCF keys statistics by the instance of the algorithm that asked for them (`_algorithm_key`), so a trial's
algorithms take the keys of the ones the statistics were collected for.

Each trial also asks NNCF for the model's insertion-point graph with the hardware's fused patterns merged. That
depends on the model's graph and the patterns, never on what the trial keeps float, and finding the patterns
(subgraph isomorphism over the whole graph) was about a third of each trial on MiniLM: it is built once per
graph and copied for every trial after (`MergedGraphs`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)

Point = tuple[int, Any]  # (the algorithm's position in the last pipeline step, its target point)


class SharedStatistics:
    """One model smoothed once and the statistics its quantisations need, collected once and extended on demand."""

    def __init__(self, model: Any, calibration: Sequence[dict[str, Any]], smoothing_alpha: float) -> None:
        import nncf
        from nncf.common.factory import build_graph

        nncf.set_log_level(logging.ERROR)  # else it logs every quantizer it places or leaves out, per trial
        self._dataset, self._size, self._alpha = nncf.Dataset(list(calibration)), len(calibration), smoothing_alpha
        base = self.pipeline(())
        self._last = len(base.pipeline_steps) - 1
        smoothed, graph = model.clone(), build_graph(model)
        for step in range(self._last):
            statistics = self._collect(base.get_statistic_points_for_step(step, smoothed, graph), smoothed, graph)
            with contextlib.redirect_stdout(io.StringIO()):  # NNCF draws progress bars whatever its log level
                smoothed = base.run_step(step, statistics, smoothed, graph)
            graph = build_graph(smoothed)
        self._smoothed, self._graph = smoothed, graph
        self._keys = [algorithm._algorithm_key for algorithm in base.pipeline_steps[self._last]]
        self.merged = MergedGraphs()
        self._statistics = self._collect(base.get_statistic_points_for_step(self._last, smoothed, graph), smoothed, graph)

    def pipeline(self, ignored: Sequence[str]) -> Any:
        """Return NNCF's post-training pipeline for the model with the operations named in ignored kept float."""
        import nncf
        from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters
        from nncf.quantization.algorithms.post_training.pipeline import create_ptq_pipeline

        return create_ptq_pipeline(
            model_type=nncf.ModelType.TRANSFORMER,
            preset=nncf.QuantizationPreset.MIXED,
            subset_size=self._size,
            ignored_scope=nncf.IgnoredScope(names=list(ignored), validate=False) if ignored else None,
            advanced_parameters=AdvancedQuantizationParameters(
                smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=self._alpha)
            ),
        )

    def quantize(self, ignored: Sequence[str]) -> Any:
        """Return the statically quantised smoothed model (operations named in ignored stay float)."""
        from openvino._offline_transformations import compress_quantize_weights_transformation

        pipeline = self.pipeline(ignored)
        algorithms = pipeline.pipeline_steps[self._last]
        with self.merged.reused():
            needed = pipeline.get_statistic_points_for_step(self._last, self._smoothed, self._graph)
        statistics = self._covering(needed, [algorithm._algorithm_key for algorithm in algorithms])
        if statistics is self._statistics:
            for algorithm, key in zip(algorithms, self._keys, strict=True):
                algorithm._algorithm_key = key
        with contextlib.redirect_stdout(io.StringIO()), self.merged.reused():
            quantized = pipeline.run_step(self._last, statistics, self._smoothed.clone(), self._graph)
        compress_quantize_weights_transformation(quantized)  # what nncf.quantize does last: int8 weight constants
        return quantized

    def _covering(self, needed: Any, keys: list[str]) -> Any:
        """Return the shared statistics once they hold every point needed (collecting the missing ones), or a
        collection of their own where the needed statistics at a shared point differ."""
        have, want = _signatures(self._statistics, self._keys), _signatures(needed, keys)
        if any(point in have and have[point] != signature for point, signature in want.items()):
            log.info("int8 trial needs other statistics at collected points: collecting its own")
            return self._collect(needed, self._smoothed, self._graph)
        missing = [point for point in want if point not in have]
        if missing:
            self._add(needed, keys, set(missing))
        return self._statistics

    def _add(self, needed: Any, keys: list[str], missing: set[Point]) -> None:
        """Collect the statistics needed at the missing points and add them to the shared ones."""
        from nncf.common.tensor_statistics.statistic_point import StatisticPoint, StatisticPointsContainer

        extra = StatisticPointsContainer()
        for algorithm, statistic_point, collector in _points(needed):
            position = keys.index(algorithm)
            if (position, statistic_point.target_point) in missing:
                extra.add_statistic_point(StatisticPoint(statistic_point.target_point, collector, self._keys[position]))
        log.info("int8 trial needs statistics at %d more points: collecting them", len(missing))
        for statistic_points in self._collect(extra, self._smoothed, self._graph).values():
            for statistic_point in statistic_points:
                self._statistics.add_statistic_point(statistic_point)

    def _collect(self, container: Any, model: Any, graph: Any) -> Any:
        """Return the container with its statistics collected over the calibration texts."""
        from nncf.quantization.algorithms.pipeline import collect_statistics

        with contextlib.redirect_stdout(io.StringIO()):
            return collect_statistics(container, model, graph, self._dataset)


class MergedGraphs:
    """NNCF's insertion-point graphs with fused patterns merged, built once per (graph, patterns) and copied after."""

    def __init__(self) -> None:
        self._built: dict[tuple[Any, ...], Any] = {}

    @contextlib.contextmanager
    def reused(self) -> Iterator[None]:
        """Within it, InsertionPointGraph.get_ip_graph_with_merged_hw_optimized_operations answers from this store."""
        from nncf.common.insertion_point_graph import InsertionPointGraph

        original = InsertionPointGraph.get_ip_graph_with_merged_hw_optimized_operations

        def merged(graph: Any, pattern: Any) -> Any:
            key = _fingerprint(graph, pattern)
            if key not in self._built:
                self._built[key] = original(graph, pattern)
                log.debug("fused-pattern graph built (%d so far); later trials copy it", len(self._built))
            return copy.deepcopy(self._built[key])

        InsertionPointGraph.get_ip_graph_with_merged_hw_optimized_operations = merged
        try:
            yield
        finally:
            InsertionPointGraph.get_ip_graph_with_merged_hw_optimized_operations = original


def _fingerprint(graph: Any, pattern: Any) -> tuple[Any, ...]:
    """Return what a merged insertion-point graph depends on: its nodes and edges, the operations under them (name,
    type and metatype: what the patterns match) and the fused patterns' graph."""
    base = graph.get_base_nx_graph()
    operations = frozenset((key, str(attrs.get("metatype"))) for key, attrs in base.nodes(data=True))
    nodes = frozenset((key, str(attrs.get("regular_node_data", ""))) for key, attrs in graph.nodes(data=True))
    patterns = frozenset(map(str, pattern.graph.nodes(data=True))), frozenset(pattern.graph.edges)
    return operations, frozenset(base.edges), nodes, frozenset(graph.edges), patterns


def _points(container: Any) -> list[tuple[str, Any, Any]]:
    """Return (algorithm key, statistic point, tensor collector) for every collector in the container."""
    return [
        (algorithm, statistic_point, collector)
        for statistic_points in container.values()
        for statistic_point in statistic_points
        for algorithm, collectors in statistic_point.algorithm_to_tensor_collectors.items()
        for collector in collectors
    ]


def _signatures(container: Any, keys: list[str]) -> dict[Point, frozenset[Any]]:
    """Return, per (algorithm position, target point), what its collectors reduce and aggregate."""
    signatures: dict[Point, set[Any]] = {}
    for algorithm, statistic_point, collector in _points(container):
        if algorithm in keys:
            signature = (frozenset(collector.reducers), frozenset(collector.aggregators.values()))
            signatures.setdefault((keys.index(algorithm), statistic_point.target_point), set()).add(signature)
    return {point: frozenset(signature) for point, signature in signatures.items()}
