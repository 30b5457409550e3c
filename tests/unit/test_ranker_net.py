"""The ranker MLP's own Adam against torch.optim.Adam: the same parameters after many steps, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.recommender.ranker_net import Adam, RankerNet


def _trained(optimiser_of: object, steps: int, lr: float) -> list[torch.Tensor]:
    """Return the parameters of a seeded RankerNet after `steps` optimiser steps on seeded batches."""
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((256, 6)).astype(np.float32))
    y = torch.from_numpy((rng.random(256) < 0.3).astype(np.float32))
    torch.manual_seed(0)
    net = RankerNet(6, 16, x.mean(0), x.std(0))
    optimiser = optimiser_of(list(net.parameters()), lr)  # type: ignore[operator]
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step in range(steps):
        index = torch.from_numpy(rng.choice(256, 32, replace=False))
        optimiser.zero_grad()
        loss_fn(net(x[index]), y[index]).backward()
        if step == 3:  # a parameter without a gradient this step is left as it is
            net.mlp[0].bias.grad = None
        optimiser.step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("lr", [1e-2, 3e-4])
def test_adam_equals_torch_optim_adam_bit_for_bit(lr: float) -> None:
    ours = _trained(lambda params, lr: Adam(params, lr=lr), 60, lr)
    torch_adam = _trained(lambda params, lr: torch.optim.Adam(params, lr=lr, foreach=False), 60, lr)
    untrained = _trained(lambda params, lr: Adam(params, lr=lr), 0, lr)
    for mine, theirs, before in zip(ours, torch_adam, untrained, strict=True):
        assert torch.equal(mine, theirs)
        assert not torch.equal(mine, before)  # every parameter moved: the comparison is not of two untouched nets
