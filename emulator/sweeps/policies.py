"""Azure ML's early termination policies (bandit, median stopping, truncation selection) as pure functions
of the trials' primary-metric histories: tables of histories in, the running trials to cancel out.

The rules, from Azure ML's "Hyperparameter tuning a model (v2)" (section "Early termination"), the CLI
v2 sweep YAML reference and azureml-train-core's hyperdrive policy docstrings:
- every report of the primary metric is one interval; the policy applies at report n when n is a
  multiple of evaluation_interval and n >= delay_evaluation;
- a trial at interval n is compared with the trials' values up to their own n-th report only, so a
  young trial is never compared with an older trial's later, better values;
- bandit: cancel when the trial's best up to n is worse than the best trial's (up to n) allowed slack:
  best/(1+slack_factor) or best-slack_amount when maximizing, best*(1+slack_factor) or best+slack_amount
  when minimizing;
- median stopping: cancel when the trial's best up to n is worse than the median of all trials'
  running averages over reports 1..n;
- truncation selection: cancel when the trial is among the lowest truncation_percentage percent of
  the trials at n (finished trials ranked too, unless exclude_finished_jobs).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Mapping, Sequence

from amlemu.errors import ConfigError
from amlemu.sweeps.fieldcheck import check_fields, integer, mapping, number

GOALS = ("maximize", "minimize")


@dataclass(frozen=True, kw_only=True)
class _Policy:
    evaluation_interval: int = 1  # the CLI v2 reference's default; 0 (azure-ai-ml's default) acts as 1
    delay_evaluation: int = 0
    type: ClassVar[str] = ""
    rest_type: ClassVar[str] = ""

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ConfigError(f"early_termination.{problem[0]}", problem[1], problem[2])

    def problem(self) -> tuple[str, str, str] | None:
        """The first invalid setting as (attribute, problem, fix), Azure ML's limits."""
        for name in ("evaluation_interval", "delay_evaluation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return name, f"must be an integer, 0 or more, got {value!r}", "intervals count primary-metric reports"
        return None

    def evaluates_at(self, report: int) -> bool:
        """Whether the policy applies at a trial's n-th report of the primary metric."""
        return report >= max(self.delay_evaluation, 1) and report % max(self.evaluation_interval, 1) == 0

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        out.update({f.name: getattr(self, f.name) for f in fields(self) if _shown(self, f.name, rest=False)})
        return out

    def to_rest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policyType": self.rest_type}
        out.update({_CAMEL[f.name]: getattr(self, f.name) for f in fields(self) if _shown(self, f.name, rest=True)})
        return out


@dataclass(frozen=True, kw_only=True)
class BanditPolicy(_Policy):
    slack_factor: float = 0.0  # 0 is "not set", as azure-ai-ml sends the one not given
    slack_amount: float = 0.0
    type: ClassVar[str] = "bandit"
    rest_type: ClassVar[str] = "Bandit"

    def problem(self) -> tuple[str, str, str] | None:
        for name in ("slack_factor", "slack_amount"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                return name, f"must be a number, 0 or more, got {value!r}", "a ratio (slack_factor) or a distance (slack_amount)"
        if self.slack_factor and self.slack_amount:
            return ("slack_amount", "set together with slack_factor",
                    "give exactly one of slack_factor (a ratio) or slack_amount (an absolute distance)")
        if not self.slack_factor and not self.slack_amount:
            return ("slack_factor", "a bandit policy needs slack_factor or slack_amount",
                    "give exactly one, e.g. slack_factor: 0.1")
        return super().problem()


@dataclass(frozen=True, kw_only=True)
class MedianStoppingPolicy(_Policy):
    type: ClassVar[str] = "median_stopping"
    rest_type: ClassVar[str] = "MedianStopping"


@dataclass(frozen=True, kw_only=True)
class TruncationSelectionPolicy(_Policy):
    truncation_percentage: int = 0
    exclude_finished_jobs: bool = False  # SDK v1 sends it (always false); az ml's YAML and REST have no such field
    type: ClassVar[str] = "truncation_selection"
    rest_type: ClassVar[str] = "TruncationSelection"

    def problem(self) -> tuple[str, str, str] | None:
        pct = self.truncation_percentage
        if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 99:
            return ("truncation_percentage", f"must be an integer between 1 and 99, got {pct!r}",
                    "the percentage of lowest performing trials to cancel at each evaluation")
        if not isinstance(self.exclude_finished_jobs, bool):
            return "exclude_finished_jobs", f"must be true or false, got {self.exclude_finished_jobs!r}", ""
        return super().problem()


Policy = BanditPolicy | MedianStoppingPolicy | TruncationSelectionPolicy
POLICIES: dict[str, type[_Policy]] = {c.type: c for c in (BanditPolicy, MedianStoppingPolicy, TruncationSelectionPolicy)}
_CAMEL = {"evaluation_interval": "evaluationInterval", "delay_evaluation": "delayEvaluation",
          "slack_factor": "slackFactor", "slack_amount": "slackAmount",
          "truncation_percentage": "truncationPercentage", "exclude_finished_jobs": "excludeFinishedJobs"}
_YAML_HINTS = {"exclude_finished_jobs": "az ml's sweep YAML has no exclude_finished_jobs (only SDK v1's "
                                        "TruncationSelectionPolicy sends it, always false): remove it"}


def _shown(policy: _Policy, name: str, rest: bool) -> bool:
    """REST carries both slacks (0 for the one not set), as azure-ai-ml sends them; YAML only what is set."""
    if name == "exclude_finished_jobs" or (name.startswith("slack_") and not rest):
        return bool(getattr(policy, name))
    return True


# --- parsing: YAML (az ml), REST (azure-ai-ml's earlyTermination), SDK v1 (HyperDriveConfig's policy) ---

def policy_from_yaml(data: Any, field: str = "early_termination") -> Policy | None:
    """`early_termination: {type: bandit, slack_factor: 0.1, evaluation_interval: 1, delay_evaluation: 5}`."""
    if data is None:
        return None
    data = mapping(data, field)
    kind = data.get("type")
    if kind not in POLICIES:
        raise ConfigError(f"{field}.type", f"unknown early termination policy {kind!r}" if kind else "required",
                          f"use one of {', '.join(POLICIES)}")
    cls = POLICIES[kind]
    names = {f.name for f in fields(cls)} - {"exclude_finished_jobs"}
    check_fields(data, names | {"type"}, field, _YAML_HINTS)
    # azure-ai-ml's schema allows null for the optional fields: null means "not given".
    return _build(cls, {k: v for k, v in data.items() if k != "type" and v is not None}, field, str)


def policy_from_rest(data: Any, field: str = "earlyTermination") -> Policy | None:
    """`earlyTermination: {policyType: Bandit, slackFactor: 0.1, evaluationInterval: 1, delayEvaluation: 5}`."""
    if data is None:
        return None
    data = mapping(data, field)
    kind = str(data.get("policyType") or "")
    by_rest = {c.rest_type.lower(): c for c in POLICIES.values()}
    if kind.lower() not in by_rest:
        raise ConfigError(f"{field}.policyType", f"unknown early termination policy {kind!r}" if kind else "required",
                          f"use one of {', '.join(c.rest_type for c in POLICIES.values())}")
    cls = by_rest[kind.lower()]
    given = {name: data[camel] for name, camel in _CAMEL.items()
             if name in {f.name for f in fields(cls)} and data.get(camel) is not None}
    return _build(cls, given, field, _CAMEL.__getitem__)


def policy_from_v1(data: Any, field: str = "policy") -> Policy | None:
    """SDK v1's HyperDriveConfig policy: `{"name": "Bandit", "properties": {"slack_factor": 0.1, ...}}`
    ("Default" is NoTerminationPolicy)."""
    if data is None:
        return None
    data = mapping(data, field)
    name = str(data.get("name") or "")
    if name.lower() == "default":
        return None
    by_v1 = {c.rest_type.lower(): c for c in POLICIES.values()}
    if name.lower() not in by_v1:
        raise ConfigError(f"{field}.name", f"unknown early termination policy {name!r}",
                          "use BanditPolicy, MedianStoppingPolicy, TruncationSelectionPolicy or NoTerminationPolicy")
    cls = by_v1[name.lower()]
    props = mapping(data.get("properties") or {}, f"{field}.properties")
    known = {f.name for f in fields(cls)}
    return _build(cls, {k: v for k, v in props.items() if k in known and v is not None}, f"{field}.properties", str)


def _build(cls: type[_Policy], given: dict[str, Any], field: str, spell: Callable[[str], str]) -> Policy:
    """Type-check each given value, then the policy's own rules; errors name the field as the user spelled it."""
    for name, value in given.items():
        where = f"{field}.{spell(name)}"
        if name in ("slack_factor", "slack_amount"):
            number(value, where, low=0)
        elif name == "exclude_finished_jobs":
            if not isinstance(value, bool):
                raise ConfigError(where, f"must be true or false, got {value!r}")
        elif name != "truncation_percentage":
            integer(value, where, low=0)
    probe = object.__new__(cls)  # check without raising the snake-case field name
    for f in fields(cls):
        object.__setattr__(probe, f.name, given.get(f.name, f.default))
    problem = probe.problem()
    if problem:
        said = [problem[1], problem[2]]
        for name in _CAMEL:  # the other fields named in the message, spelled as the user's form spells them
            said = [s.replace(name, spell(name)) for s in said]
        raise ConfigError(f"{field}.{spell(problem[0])}", said[0], said[1] or None)
    return cls(**given)  # type: ignore[return-value]


# --- evaluation ---

@dataclass(frozen=True)
class TrialHistory:
    """One trial's primary-metric reports in the order logged, and its status. Only a trial whose
    status is Running can be cancelled; every trial's reports count in the comparisons."""
    reports: tuple[float, ...]
    status: str = "running"

    @classmethod
    def of(cls, reports: Sequence[float | tuple[int, float]], status: str = "running") -> TrialHistory:
        """From values or (step, value) pairs as MLflow keeps them; non-finite values are not reports."""
        values = (r[1] if isinstance(r, (tuple, list)) else r for r in reports)
        return cls(tuple(float(v) for v in values if math.isfinite(float(v))), status)

    @property
    def running(self) -> bool:
        return self.status.lower() == "running"


@dataclass(frozen=True)
class Decision:
    """A running trial to cancel, the interval (report count) it was judged at, and why, in one line."""
    trial: str
    policy: str
    interval: int
    reason: str


def to_cancel(policy: Policy | None, histories: Mapping[str, TrialHistory], goal: str,
              seen: Mapping[str, int] | None = None) -> list[Decision]:
    """The running trials that `policy` cancels now. Each is judged at the evaluation intervals it has
    reached since `seen[trial]` reports (the counts at the caller's previous call: each interval is
    judged once, so a cancelled trial's slot is not refilled); without `seen`, at its latest one."""
    if policy is None:
        return []
    sign = _sign(goal)
    rule = _RULES[policy.type]
    out: list[Decision] = []
    for name in sorted(histories):
        history = histories[name]
        if not history.running:
            continue
        for n in _points(policy, len(history.reports), None if seen is None else seen.get(name, 0)):
            reason = rule(policy, name, n, histories, sign)  # type: ignore[arg-type]
            if reason:
                out.append(Decision(name, policy.type, n, reason))
                break
    return out


def _points(policy: _Policy, reports: int, since: int | None) -> list[int]:
    if since is None:
        step = max(policy.evaluation_interval, 1)
        latest = reports - reports % step
        return [latest] if latest and policy.evaluates_at(latest) else []
    return [n for n in range(since + 1, reports + 1) if policy.evaluates_at(n)]


def _sign(goal: str) -> int:
    if str(goal).lower() not in GOALS:
        raise ConfigError("objective.goal", f"must be maximize or minimize, got {goal!r}")
    return 1 if str(goal).lower() == "maximize" else -1


def _best(values: Sequence[float], sign: int) -> float:
    return max(values) if sign > 0 else min(values)


def _worse(value: float, bound: float, sign: int) -> bool:
    """Strictly worse; a value equal to the bound but for float rounding (an average of equal values) is not."""
    if math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12):
        return False
    return value < bound if sign > 0 else value > bound


def _peers(histories: Mapping[str, TrialHistory], n: int) -> dict[str, tuple[float, ...]]:
    """Every trial that reported n times, with its first n reports only."""
    return {name: h.reports[:n] for name, h in histories.items() if len(h.reports) >= n}


def _g(x: float) -> str:
    return f"{x:.4g}"


def _bandit(policy: BanditPolicy, name: str, n: int, histories: Mapping[str, TrialHistory], sign: int) -> str:
    bests = {t: _best(v, sign) for t, v in _peers(histories, n).items()}
    leader = sorted(bests, key=lambda t: (-sign * bests[t], t))[0]
    best = bests[leader]
    if policy.slack_factor:
        allowed = best / (1 + policy.slack_factor) if sign > 0 else best * (1 + policy.slack_factor)
        slack = f"slack factor {policy.slack_factor:g}"
    else:
        allowed = best - sign * policy.slack_amount
        slack = f"slack amount {policy.slack_amount:g}"
    if not _worse(bests[name], allowed, sign):
        return ""
    return (f"bandit: best {_g(best)} ({leader}), {slack}, allowed {_g(allowed)}, "
            f"trial's {_g(bests[name])} at interval {n}")


def _median(policy: MedianStoppingPolicy, name: str, n: int, histories: Mapping[str, TrialHistory], sign: int) -> str:
    peers = _peers(histories, n)
    median = statistics.median(statistics.fmean(v) for v in peers.values())
    best = _best(peers[name], sign)
    if not _worse(best, median, sign):
        return ""
    return (f"median_stopping: trial's best {_g(best)} at interval {n} is worse than {_g(median)}, the median of "
            f"{len(peers)} trials' running averages over intervals 1-{n}")


def _truncation(policy: TruncationSelectionPolicy, name: str, n: int, histories: Mapping[str, TrialHistory],
                sign: int) -> str:
    pool = {t: v for t, v in _peers(histories, n).items()
            if histories[t].running or not policy.exclude_finished_jobs}
    # Each trial's performance at interval n is its best up to n; ties go to the earlier name.
    ranked = sorted(pool, key=lambda t: (sign * _best(pool[t], sign), t))
    cut = len(pool) * policy.truncation_percentage // 100
    if name not in ranked[:cut]:
        return ""
    rank = ranked.index(name) + 1
    return (f"truncation_selection: trial's {_g(_best(pool[name], sign))} at interval {n} ranks {rank} from the "
            f"bottom of {len(pool)} trials, within the lowest {policy.truncation_percentage}% ({cut})")


_RULES: dict[str, Callable[..., str]] = {"bandit": _bandit, "median_stopping": _median,
                                         "truncation_selection": _truncation}
