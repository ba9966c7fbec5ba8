"""A sweep's sampling algorithm: parsed from the CLI v2 YAML shape (`sampling_algorithm: random`, or
`{type: random, seed: 1, rule: sobol}`) and the REST shape (`{samplingAlgorithmType: Random, seed: 1,
rule: Sobol}`), checked against the search space with Azure ML's rules, and the samplers themselves.

A sampler's `suggest(history)` gives the next trial's values, or None when the space is exhausted
(grid); `history` holds every trial suggested so far, running ones too (draw.History). Random and
grid suggestions are a function of the seed and len(history) alone (the k-th trial's values are
the same after a restart); bayesian's of the seed and the history's values and metrics."""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Union

from amlemu.errors import ConfigError
from amlemu.sweeps.bayesian import BAYESIAN_KINDS, BayesianSampler
from amlemu.sweeps.draw import History, is_distribution, new_seed, realize
from amlemu.sweeps.space import LOG_KINDS, Branch, Choice, SearchSpace, leaves

RULES = ("random", "sobol")
GOALS = ("maximize", "minimize")


@dataclass(frozen=True)
class SamplingAlgorithm:
    type: str  # random | grid | bayesian
    seed: Optional[int] = None  # random only
    rule: Optional[str] = None  # random only: random (the default) | sobol
    logbase: Union[float, str, None] = None  # random only: the log distributions' base; "e" or None: e


class Sampler(Protocol):
    seed: int

    def suggest(self, history: History) -> Optional[dict[str, Any]]: ...


class RandomSampler:
    """Random (`rule: random`) or scrambled-Sobol (`rule: sobol`) points through each distribution."""

    def __init__(self, space: SearchSpace, algorithm: SamplingAlgorithm, goal: str = "maximize",
                 seed: Optional[int] = None) -> None:
        self.space, self.rule, self.seed = space, algorithm.rule or "random", new_seed(algorithm.seed, seed)
        base = algorithm.logbase
        self.logbase = math.e if base in (None, "e") else float(base)  # type: ignore[arg-type]
        self.dims = {path: i for i, (path, _) in enumerate(leaves(space))}
        self._engine: Any = None  # scipy's Sobol engine, made on the first sobol suggestion

    def suggest(self, history: History) -> dict[str, Any]:
        k = len(history)
        if self.rule == "sobol":
            point = self._sobol_point(k)
            return realize(self.space, lambda path: float(point[self.dims[path]]), self.logbase)
        import numpy as np  # noqa: PLC0415 - here: every CLI call and the service import this module (~0.1-0.2 s)

        rng = np.random.default_rng([self.seed, k])
        return realize(self.space, lambda _path: float(rng.random()), self.logbase)

    def _sobol_point(self, k: int) -> Any:
        """The sequence's k-th point: the engine kept between calls, a new one only to go back."""
        if self._engine is None or self._engine.num_generated > k:
            from scipy.stats import qmc  # about a second to import: only a sobol sweep pays for it

            self._engine = qmc.Sobol(d=len(self.dims), scramble=True, rng=self.seed)
        if k > self._engine.num_generated:
            self._engine.fast_forward(k - self._engine.num_generated)
        with warnings.catch_warnings():  # the sequence's balance needs 2**m points: a sweep takes what it takes
            warnings.simplefilter("ignore", UserWarning)
            return self._engine.random(1)[0]


class GridSampler:
    """Every combination of the choices, in order: the last parameter varies fastest, a conditional
    choice's options expand into their own nested combinations."""

    def __init__(self, space: SearchSpace, algorithm: SamplingAlgorithm, goal: str = "maximize",
                 seed: Optional[int] = None) -> None:
        self.seed = 0  # nothing random
        self.names = space.names
        self.options = [_grid_options(dist) for _, dist in space.params]
        self.size = math.prod(len(o) for o in self.options)

    def suggest(self, history: History) -> Optional[dict[str, Any]]:
        k = len(history)
        if k >= self.size:
            return None
        picked = []
        for options in reversed(self.options):
            k, i = divmod(k, len(options))
            picked.append(options[i])
        return dict(zip(self.names, reversed(picked)))


def _grid_options(dist: Choice) -> list[Any]:
    out: list[Any] = []
    for option in dist.values:
        if not isinstance(option, Branch):
            out.append(option)
            continue
        keys = [key for key, _ in option.items]
        nested = [_grid_options(v) if is_distribution(v) else [v] for _, v in option.items]
        for combo in _product(nested):
            out.append(dict(zip(keys, combo)))
    return out


def _product(lists: list[list[Any]]) -> list[tuple[Any, ...]]:
    combos: list[tuple[Any, ...]] = [()]
    for options in lists:
        combos = [c + (o,) for c in combos for o in options]
    return combos


SAMPLERS: dict[str, type] = {"random": RandomSampler, "grid": GridSampler, "bayesian": BayesianSampler}


def parse_sampling(data: object, field: str = "sampling_algorithm") -> SamplingAlgorithm:
    """The CLI v2 YAML shape: a name, or a mapping with `type` (random's seed, rule and logbase too)."""
    if isinstance(data, str):
        return _algorithm(data, {}, field, f"{field}")
    if not isinstance(data, Mapping) or "type" not in data:
        raise ConfigError(f"{field}.type" if isinstance(data, Mapping) else field, "is missing",
                          "give random, grid or bayesian, e.g. sampling_algorithm: {type: random, seed: 1}")
    return _algorithm(data["type"], {k: v for k, v in data.items() if k != "type"}, field, f"{field}.type")


def parse_rest_sampling(data: object, field: str = "samplingAlgorithm") -> SamplingAlgorithm:
    """The REST shape: {samplingAlgorithmType: Random | Grid | Bayesian, seed, rule, logbase}; nulls are absent."""
    key = "samplingAlgorithmType"
    if not isinstance(data, Mapping) or key not in data:
        raise ConfigError(f"{field}.{key}", "is missing", "give Random, Grid or Bayesian")
    extra = {k: v for k, v in data.items() if k != key and v is not None}
    return _algorithm(data[key], extra, field, f"{field}.{key}")


def _algorithm(kind: object, extra: dict[str, Any], field: str, type_field: str) -> SamplingAlgorithm:
    name = kind.lower() if isinstance(kind, str) else None
    if name not in SAMPLERS:
        raise ConfigError(type_field, f"unknown sampling algorithm {kind!r}", "use random, grid or bayesian")
    allowed = ("seed", "rule", "logbase") if name == "random" else ()
    for key in extra:
        if key not in allowed:
            fix = "only random sampling takes seed, rule and logbase" if key in ("seed", "rule", "logbase") \
                else f"{name} sampling takes {', '.join(allowed) or 'no other field'}"
            raise ConfigError(f"{field}.{key}", f"is not a field of {name} sampling", f"remove it; {fix}")
    seed, rule, logbase = extra.get("seed"), extra.get("rule"), extra.get("logbase")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(f"{field}.seed", f"must be a non-negative integer, not {seed!r}")
    if rule is not None and (not isinstance(rule, str) or rule.lower() not in RULES):
        raise ConfigError(f"{field}.rule", f"unknown rule {rule!r}", "use random or sobol")
    if logbase is not None and logbase != "e" and (isinstance(logbase, bool) or not isinstance(logbase, (int, float))
                                                   or not 0 < logbase < math.inf or logbase == 1):
        raise ConfigError(f"{field}.logbase", f"must be a positive number other than 1, or \"e\", not {logbase!r}")
    return SamplingAlgorithm(name, seed, rule.lower() if rule else None, logbase)


def sampling_to_yaml(algorithm: SamplingAlgorithm) -> Union[str, dict[str, Any]]:
    """The CLI v2 YAML shape: the bare name when nothing else is set (parse_sampling round-trips it)."""
    extra = {k: v for k, v in (("seed", algorithm.seed), ("rule", algorithm.rule), ("logbase", algorithm.logbase))
             if v is not None}
    return {"type": algorithm.type, **extra} if extra else algorithm.type


def sampling_to_rest(algorithm: SamplingAlgorithm) -> dict[str, Any]:
    """The REST shape, as azure-ai-ml sends it (parse_rest_sampling round-trips it)."""
    out: dict[str, Any] = {"samplingAlgorithmType": algorithm.type.capitalize()}
    if algorithm.type == "random":
        out |= {"seed": algorithm.seed, "rule": algorithm.rule.capitalize() if algorithm.rule else None}
        if algorithm.logbase is not None:
            out["logbase"] = algorithm.logbase
    return out


def _coerce(algorithm: Union[str, Mapping[str, Any], SamplingAlgorithm]) -> SamplingAlgorithm:
    return algorithm if isinstance(algorithm, SamplingAlgorithm) else parse_sampling(algorithm)


def validate_sampling(algorithm: Union[str, Mapping[str, Any], SamplingAlgorithm], space: SearchSpace) -> None:
    """Azure ML's rules for the algorithm against the space, each refusal one line naming the parameter."""
    alg, field = _coerce(algorithm), "sampling_algorithm"
    allowed = {"grid": ("choice",), "bayesian": BAYESIAN_KINDS}.get(alg.type)
    for path, dist in leaves(space):
        if allowed and dist.type not in allowed:
            others = "random or bayesian" if alg.type == "grid" else "random"
            raise ConfigError(field, f"{alg.type} sampling supports only {_words(allowed, 'and')} distributions, "
                              f"and search_space.{path} is {dist.type}",
                              f"make {path} a {_words(allowed, 'or')}, or use {others} sampling")
        if alg.type == "random" and alg.logbase not in (None, "e") and dist.type in LOG_KINDS:
            top = getattr(dist, "max_value", None)
            if top is not None and top * math.log(float(alg.logbase)) > 709:  # type: ignore[arg-type]
                raise ConfigError(field, f"logbase {alg.logbase} ** search_space.{path}.max_value ({top}) overflows",
                                  "lower max_value (the bounds are exponents) or the logbase")


def _words(items: tuple[str, ...], last: str) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def make_sampler(algorithm: Union[str, Mapping[str, Any], SamplingAlgorithm], space: SearchSpace,
                 goal: str = "maximize", seed: Optional[int] = None) -> Sampler:
    """The sampler for a validated sweep; `goal` is the objective's (bayesian's direction), `seed` the
    one to use where the algorithm gives none (bayesian never does; unseeded random)."""
    alg = _coerce(algorithm)
    validate_sampling(alg, space)
    if not isinstance(goal, str) or goal.lower() not in GOALS:
        raise ConfigError("objective.goal", f"unknown goal {goal!r}", "use maximize or minimize")
    return SAMPLERS[alg.type](space, alg, goal=goal.lower(), seed=seed)  # type: ignore[no-any-return]
