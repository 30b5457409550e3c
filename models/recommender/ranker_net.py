"""The stage-two MLP in torch, for training only (serving runs its numpy twin, models/recommender/ranker_models.py MlpScorer)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class RankerNet(torch.nn.Module):
    """Standardised features -> two hidden ReLU layers -> one logit."""

    def __init__(self, n_features: int, hidden: int, mean: torch.Tensor | None = None, std: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features) if mean is None else mean.float())
        self.register_buffer("std", torch.ones(n_features) if std is None else std.float())
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(n_features, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return one logit per row."""
        mean, std = self.get_buffer("mean"), self.get_buffer("std")
        return torch.as_tensor(self.mlp((x - mean) / std)).squeeze(-1)


class Adam:
    """Adam without weight decay, computed as torch.optim.Adam computes it on the CPU (its single-tensor path).

    Written out because torch.optim's first call imports torch._dynamo (its methods are wrapped to disable it): 1.0 s
    of a 2-core host's CPU in every run process that trains the ranker, for a 3-layer MLP. tests/unit/test_ranker_net.py
    holds it to torch.optim.Adam's parameters after many steps, bit for bit.
    """

    def __init__(
        self, params: list[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
    ) -> None:
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
        self.steps = [0] * len(params)  # per parameter, as torch counts them: one without a gradient is not stepped

    def zero_grad(self) -> None:
        """Drop every parameter's gradient."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Move each parameter one Adam step along its gradient."""
        beta1, beta2 = self.betas
        for i, (p, (mean, square)) in enumerate(zip(self.params, self.moments, strict=True)):
            if p.grad is None:
                continue
            self.steps[i] += 1
            step_size = self.lr / (1 - beta1 ** self.steps[i])
            correction2_sqrt = (1 - beta2 ** self.steps[i]) ** 0.5
            mean.lerp_(p.grad, 1 - beta1)
            square.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            p.addcdiv_(mean, (square.sqrt() / correction2_sqrt).add_(self.eps), value=-step_size)


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of the MLP's training."""

    hidden: int = 32
    epochs: int = 20
    batch_size: int = 64
    learning_rate: float = 1e-2
    seed: int = 0


def fit_net(x: np.ndarray, y: np.ndarray, config: TrainConfig) -> RankerNet:
    """Return a RankerNet fitted with Adam on binary cross-entropy; deterministic for a seed and thread count."""
    features, labels = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y.astype(np.float32))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        spread = features.std(0) if len(x) > 1 else torch.zeros(x.shape[1])  # one row has no spread (not NaN)
        net = RankerNet(x.shape[1], config.hidden, features.mean(0), spread.clamp(min=1e-6))
    optimiser = Adam(list(net.parameters()), lr=config.learning_rate)
    loss_fn, order_rng = torch.nn.BCEWithLogitsLoss(), np.random.default_rng(config.seed)
    for _ in range(config.epochs):
        for batch in np.array_split(order_rng.permutation(len(x)), max(1, len(x) // config.batch_size)):
            index = torch.from_numpy(batch)
            optimiser.zero_grad()
            loss_fn(net(features[index]), labels[index]).backward()
            optimiser.step()
    return net.eval()
