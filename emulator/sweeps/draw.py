"""A distribution's value at a point of the unit interval, as Azure ML documents each one: randint
in [0, upper), loguniform exp(uniform(min_value, max_value)), lognormal exp(normal(mu, sigma)), a
q-variant round(value / q) * q. Random sampling feeds it pseudo-random points, sobol sampling the
points of a scrambled Sobol sequence (one dimension per distribution, nested ones included)."""
from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist
from typing import Any, Optional

from amlemu.sweeps.space import KINDS, LOG_KINDS, Branch, Choice, SearchSpace

# What a sampler is given: every trial suggested so far, running ones too, as (the values it was
# given, its primary metric or None: running, failed, or never logged it).
History = Sequence[tuple[Mapping[str, Any], Optional[float]]]
# A normal's quantile at u = 1e-12 is 7.03 sigma from its mean: inside space.LOGNORMAL_SIGMAS.
EDGE = 1e-12


def new_seed(*seeds: Optional[int]) -> int:
    """The first seed given; else a fresh one (Azure ML's unseeded sweeps differ run to run)."""
    return next((s for s in seeds if s is not None), secrets.randbelow(2**31))


def is_distribution(value: object) -> bool:
    return isinstance(value, tuple(KINDS.values()))


def quantize(x: float, q: float) -> int | float:
    """round(x / q) * q; an integer when q is one (quniform(16, 128, 16) gives 32, not 32.0), else a
    float without the binary noise of the product (0.30000000000000004 -> 0.3)."""
    r = round(x / q) * q
    return int(r) if isinstance(q, int) else float(f"{r:.12g}")


def choice_index(dist: Choice, u: float) -> int:
    return min(int(u * len(dist.values)), len(dist.values) - 1)


def value_at(dist: Any, u: float, logbase: float = math.e) -> Any:
    """The value of a distribution other than a choice at u in [0, 1)."""
    kind = dist.type
    if kind == "randint":
        return min(int(u * dist.upper), dist.upper - 1)
    if kind in ("uniform", "loguniform", "quniform", "qloguniform"):
        x = dist.min_value + u * (dist.max_value - dist.min_value)
    else:
        x = NormalDist(dist.mu, dist.sigma).inv_cdf(min(max(u, EDGE), 1 - EDGE))
    if kind in LOG_KINDS:
        x = math.exp(x) if logbase == math.e else logbase ** x
    if kind.startswith("q"):
        return quantize(x, dist.q)
    return float(x)


def realize(space: SearchSpace, unit: Callable[[str], float], logbase: float = math.e) -> dict[str, Any]:
    """One trial's values: each distribution's point from `unit(path)` (path as space.leaves names it);
    a conditional choice's option becomes a mapping of its values, nested draws included."""
    def one(path: str, dist: Any) -> Any:
        u = unit(path)
        if not isinstance(dist, Choice):
            return value_at(dist, u, logbase)
        i = choice_index(dist, u)
        option = dist.values[i]
        if not isinstance(option, Branch):
            return option
        return {key: one(f"{path}.values[{i}].{key}", value) if is_distribution(value) else value
                for key, value in option.items}

    return {name: one(name, dist) for name, dist in space.params}
