"""Bayesian sampling on Optuna's TPE sampler (a maintained optimizer, not our own).

Azure ML's bayesian sampling takes choice, uniform and quniform only. Each suggestion builds an
in-memory study from the history (finished trials told their metric; running, failed or silent ones
as running, which the constant-liar rule keeps new suggestions away from) and asks it once: a pure
function of the seed and the history, so a restarted sweep suggests what the first one would have.
TPE rather than Optuna's GPSampler: that one needs torch (the `trainer` extra, not the core install)
and takes seconds a suggestion where TPE takes milliseconds."""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from amlemu.sweeps.draw import History, is_distribution, new_seed, quantize
from amlemu.sweeps.space import Branch, Choice, SearchSpace

if TYPE_CHECKING:
    from amlemu.sweeps.sampling import SamplingAlgorithm

BAYESIAN_KINDS = ("choice", "uniform", "quniform")


def _optuna() -> Any:
    """Imported on first use (about half a second): only a bayesian sweep pays for it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # its per-trial INFO lines are not the sweep's log
    return optuna


class BayesianSampler:
    def __init__(self, space: SearchSpace, algorithm: SamplingAlgorithm, goal: str = "maximize",
                 seed: Optional[int] = None) -> None:
        self.space, self.goal, self.seed = space, goal, new_seed(seed)

    def suggest(self, history: History) -> dict[str, Any]:
        import numpy as np  # noqa: PLC0415 - here, as optuna: not on every CLI call's import path

        optuna = _optuna()
        with warnings.catch_warnings():  # constant_liar is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=int(np.random.SeedSequence([self.seed, len(history)])
                                                          .generate_state(1)[0]), constant_liar=True)
        study = optuna.create_study(direction=self.goal, sampler=sampler)
        for values, metric in history:
            params: dict[str, Any] = {}
            dists: dict[str, Any] = {}
            if not all(_invert(path, dist, values.get(path), params, dists, optuna)
                       for path, dist in self.space.params if path in values):
                continue  # values this space cannot have given (an edited space): nothing to learn from
            done = metric is not None and math.isfinite(metric)
            state = optuna.trial.TrialState.COMPLETE if done else optuna.trial.TrialState.RUNNING
            study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, state=state,
                                                      value=float(metric) if done else None))
        trial = study.ask()
        return {name: _suggest(trial, name, dist) for name, dist in self.space.params}


def _suggest(trial: Any, path: str, dist: Any) -> Any:
    """A choice is a categorical over its options' indices (its values may be mappings)."""
    if isinstance(dist, Choice):
        i = trial.suggest_categorical(path, list(range(len(dist.values))))
        option = dist.values[i]
        if not isinstance(option, Branch):
            return option
        return {key: _suggest(trial, f"{path}.values[{i}].{key}", value) if is_distribution(value) else value
                for key, value in option.items}
    x = trial.suggest_float(path, dist.min_value, dist.max_value)
    return quantize(x, dist.q) if dist.type == "quniform" else x


def _invert(path: str, dist: Any, value: Any, params: dict[str, Any], dists: dict[str, Any], optuna: Any) -> bool:
    """The study's parameters for values a trial was given; False when no option matches."""
    if isinstance(dist, Choice):
        i = _option_index(dist, value)
        if i is None:
            return False
        params[path], dists[path] = i, optuna.distributions.CategoricalDistribution(list(range(len(dist.values))))
        option = dist.values[i]
        nested = option.items if isinstance(option, Branch) else ()
        return all(_invert(f"{path}.values[{i}].{key}", sub, value.get(key), params, dists, optuna)
                   for key, sub in nested if is_distribution(sub))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    # a quniform's rounded value may fall just outside its bounds
    params[path] = min(max(float(value), dist.min_value), dist.max_value)
    dists[path] = optuna.distributions.FloatDistribution(dist.min_value, dist.max_value)
    return True


def _option_index(dist: Choice, value: Any) -> Optional[int]:
    for i, option in enumerate(dist.values):
        if isinstance(option, Branch):
            fixed = {k: v for k, v in option.items if not is_distribution(v)}
            if (isinstance(value, Mapping) and set(value) == {k for k, _ in option.items}
                    and all(value[k] == v for k, v in fixed.items())):
                return i
        elif option == value and isinstance(option, str) == isinstance(value, str):
            return i
    return None
