"""A sweep's objective and limits, from az ml's YAML and Azure ML's REST shape, with Azure ML's defaults and bounds.

Sources: the CLI v2 sweep job YAML reference (limits: max_total_trials default 1000, max_concurrent_trials
defaults to max_total_trials, timeout default 5184000 s, trial_timeout none), "Hyperparameter tuning a model
(v2)" (max_total_trials and max_concurrent_trials integers between 1 and 1000, timeouts in seconds),
azure-ai-ml's schemas (objective and limits.max_total_trials required in YAML; goal case-insensitive,
sent lower-case) and its SweepJobLimits (a timeout under 60 s is sent as 60 s; 0 is sent as no timeout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amlemu.errors import ConfigError
from amlemu.sweeps.fieldcheck import check_fields, format_duration, integer, mapping, parse_duration, text

GOALS = ("maximize", "minimize")
DEFAULT_MAX_TOTAL_TRIALS = 1000
MAX_TRIALS = 1000  # both max_total_trials and max_concurrent_trials
DEFAULT_TIMEOUT_S = 5184000  # 60 days: the CLI v2 reference's default for limits.timeout
MIN_TIMEOUT_S = 60  # azure-ai-ml raises shorter timeouts to 60 s (the service mishandles shorter ones)


@dataclass(frozen=True)
class Objective:
    """The primary metric the trials log and whether a higher or lower value is better."""
    goal: str
    primary_metric: str

    def __post_init__(self) -> None:
        goal = _goal(self.goal, "objective.goal")
        object.__setattr__(self, "goal", goal)
        text(self.primary_metric, "objective.primary_metric")

    @property
    def maximize(self) -> bool:
        return self.goal == "maximize"

    def better(self, a: float, b: float) -> bool:
        """Whether a is strictly better than b under this goal."""
        return a > b if self.maximize else a < b

    @classmethod
    def from_yaml(cls, data: Any, field: str = "objective") -> Objective:
        """`objective: {goal: maximize, primary_metric: accuracy}` (both required, as az ml's schema)."""
        if data is None:
            raise ConfigError(field, "required", "e.g. objective: {goal: maximize, primary_metric: accuracy}")
        data = mapping(data, field)
        check_fields(data, {"goal", "primary_metric"}, field)
        for key in ("goal", "primary_metric"):
            if data.get(key) is None:
                raise ConfigError(f"{field}.{key}", "required", "e.g. objective: {goal: maximize, primary_metric: accuracy}")
        return cls(_goal(data["goal"], f"{field}.goal"), text(data["primary_metric"], f"{field}.primary_metric"))

    @classmethod
    def from_rest(cls, data: Any, field: str = "objective") -> Objective:
        """`objective: {goal: Maximize, primaryMetric: accuracy}` (azure-ai-ml sends the goal lower-case)."""
        data = mapping(data, field)
        for key in ("goal", "primaryMetric"):
            if data.get(key) is None:
                raise ConfigError(f"{field}.{key}", "required", "objective needs goal and primaryMetric")
        return cls(_goal(data["goal"], f"{field}.goal"), text(data["primaryMetric"], f"{field}.primaryMetric"))

    def to_yaml(self) -> dict[str, Any]:
        return {"goal": self.goal, "primary_metric": self.primary_metric}

    def to_rest(self) -> dict[str, Any]:
        return {"goal": self.goal.capitalize(), "primaryMetric": self.primary_metric}


def _goal(value: Any, field: str) -> str:
    if not isinstance(value, str) or value.lower() not in GOALS:
        raise ConfigError(field, f"must be maximize or minimize, got {value!r}")
    return value.lower()


@dataclass(frozen=True)
class SweepLimits:
    """A sweep's limits as given (None: not given); `concurrency` and `sweep_timeout` apply Azure's defaults.
    Timeouts are seconds."""
    max_total_trials: int = DEFAULT_MAX_TOTAL_TRIALS
    max_concurrent_trials: int | None = None
    timeout: int | None = None
    trial_timeout: int | None = None

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ConfigError(f"limits.{problem[0]}", problem[1], problem[2])

    def problem(self) -> tuple[str, str, str] | None:
        """The first value out of Azure ML's bounds as (attribute, problem, fix)."""
        for name in ("max_total_trials", "max_concurrent_trials"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TRIALS):
                return name, f"must be an integer between 1 and {MAX_TRIALS}, got {value!r}", "Azure ML's limit"
        for name in ("timeout", "trial_timeout"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                return name, f"must be a positive number of seconds, got {value!r}", "leave it out for no limit"
        return None

    @property
    def concurrency(self) -> int:
        """How many trials may run at once: max_concurrent_trials, or else max_total_trials (Azure's default)."""
        return min(self.max_concurrent_trials or self.max_total_trials, self.max_total_trials)

    @property
    def sweep_timeout(self) -> int:
        return self.timeout or DEFAULT_TIMEOUT_S

    @classmethod
    def from_yaml(cls, data: Any, field: str = "limits") -> SweepLimits:
        """`limits: {max_total_trials: 20, max_concurrent_trials: 4, timeout: 7200, trial_timeout: 600}`;
        az ml requires limits and limits.max_total_trials."""
        if data is None:
            raise ConfigError(field, "required", "e.g. limits: {max_total_trials: 20, max_concurrent_trials: 4}")
        data = mapping(data, field)
        check_fields(data, {"max_total_trials", "max_concurrent_trials", "timeout", "trial_timeout"}, field)
        if data.get("max_total_trials") is None:
            raise ConfigError(f"{field}.max_total_trials", "required", "the most trials the sweep runs, 1 to 1000")
        given = {k: integer(v, f"{field}.{k}", low=0 if "timeout" in k else None)
                 for k, v in data.items() if v is not None}
        for key in ("timeout", "trial_timeout"):
            if key in given:  # as azure-ai-ml: 0 is no timeout, 1-59 s become 60 s
                given[key] = max(given[key], MIN_TIMEOUT_S) if given[key] else None
        return _limits(given, field, str)

    @classmethod
    def from_rest(cls, data: Any, field: str = "limits") -> SweepLimits:
        """`limits: {jobLimitsType: Sweep, maxTotalTrials: 20, maxConcurrentTrials: 4, timeout: "PT2H",
        trialTimeout: "PT10M"}`; absent (the SDK sent none): Azure's defaults."""
        if data is None:
            return cls()
        data = mapping(data, field)
        kind = data.get("jobLimitsType")
        if kind is not None and str(kind).lower() != "sweep":
            raise ConfigError(f"{field}.jobLimitsType", f"must be Sweep for a sweep job, got {kind!r}")
        given: dict[str, Any] = {}
        for name, key in _REST_KEYS.items():
            if data.get(key) is None:
                continue
            where = f"{field}.{key}"
            given[name] = parse_duration(data[key], where) if "timeout" in name else integer(data[key], where)
            if given[name] == 0 and "timeout" in name:
                given[name] = None
        return _limits(given, field, _REST_KEYS.__getitem__)

    def to_yaml(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def to_rest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"jobLimitsType": "Sweep"}
        for name, key in _REST_KEYS.items():
            value = getattr(self, name)
            if value is not None:
                out[key] = format_duration(value) if "timeout" in name else value
        return out


_REST_KEYS = {"max_total_trials": "maxTotalTrials", "max_concurrent_trials": "maxConcurrentTrials",
              "timeout": "timeout", "trial_timeout": "trialTimeout"}


def _limits(given: dict[str, Any], field: str, spell: Any) -> SweepLimits:
    probe = object.__new__(SweepLimits)
    for name in _REST_KEYS:
        object.__setattr__(probe, name, given.get(name, getattr(SweepLimits, name)))
    problem = probe.problem()
    if problem:
        raise ConfigError(f"{field}.{spell(problem[0])}", problem[1], problem[2])
    return SweepLimits(**given)
