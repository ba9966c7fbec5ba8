"""A sweep's early termination policies on fixed tables of metric histories (Azure ML's documented
examples among them), and its policy, objective and limits parsed from az ml's YAML and the REST shape."""
from __future__ import annotations

import pytest

from amlemu.errors import ConfigError
from amlemu.sweeps.fieldcheck import format_duration, parse_duration
from amlemu.sweeps.limits import DEFAULT_TIMEOUT_S, Objective, SweepLimits
from amlemu.sweeps.policies import (POLICIES, BanditPolicy, MedianStoppingPolicy, TrialHistory,
                                    TruncationSelectionPolicy, policy_from_rest, policy_from_v1, policy_from_yaml,
                                    to_cancel)


def _h(*values: float, status: str = "running") -> TrialHistory:
    return TrialHistory.of(list(values), status)


def _cancelled(policy, histories, goal="maximize", seen=None) -> dict[str, int]:
    return {d.trial: d.interval for d in to_cancel(policy, histories, goal, seen)}


# --- bandit ---

def test_bandit_docs_example_slack_factor_cancels_below_best_over_one_plus_slack() -> None:
    # The docs: best 0.8 at interval 10, slack_factor 0.2: a trial whose best is under 0.8/1.2 = 0.667 ends.
    policy = BanditPolicy(slack_factor=0.2, evaluation_interval=10)
    histories = {"s_1": _h(*[0.5] * 9, 0.8, status="completed"), "s_2": _h(*[0.66] * 10), "s_3": _h(*[0.67] * 10)}
    decisions = to_cancel(policy, histories, "maximize")
    assert [(d.trial, d.interval) for d in decisions] == [("s_2", 10)]
    assert decisions[0].reason == "bandit: best 0.8 (s_1), slack factor 0.2, allowed 0.6667, trial's 0.66 at interval 10"


def test_bandit_slack_amount_is_an_absolute_distance_both_goals() -> None:
    # azureml-train-core's example: best 0.8, slack_amount 0.2: under 0.6 ends.
    policy = BanditPolicy(slack_amount=0.2)
    histories = {"a": _h(0.8), "b": _h(0.59), "c": _h(0.61)}
    assert _cancelled(policy, histories) == {"b": 1}
    lows = {"a": _h(0.2), "b": _h(0.41), "c": _h(0.39)}
    assert _cancelled(policy, lows, "minimize") == {"b": 1}
    assert to_cancel(policy, lows, "minimize")[0].reason.startswith("bandit: best 0.2 (a), slack amount 0.2, allowed 0.4,")


def test_bandit_minimize_allows_best_times_one_plus_slack() -> None:
    policy = BanditPolicy(slack_factor=0.5)
    histories = {"a": _h(0.2), "b": _h(0.31), "c": _h(0.29)}
    assert _cancelled(policy, histories, "Minimize") == {"b": 1}


def test_bandit_uses_each_trials_best_so_far_and_never_cancels_the_leader_or_a_finished_trial() -> None:
    policy = BanditPolicy(slack_factor=0.1)
    histories = {"a": _h(0.9, 0.2), "b": _h(0.5, 0.5, status="completed"), "c": _h(0.95, 0.1)}
    # a's best at 2 is 0.9 (within 0.95/1.1 = 0.864); b is worse but finished; c leads.
    assert _cancelled(policy, histories) == {}


def test_docs_example_delay_5_interval_1_nothing_before_interval_5() -> None:
    # BanditPolicy(slack_factor=0.1, delay_evaluation=5, evaluation_interval=1): applied from interval 5 on.
    policy = BanditPolicy(slack_factor=0.1, delay_evaluation=5, evaluation_interval=1)
    leader = [0.9] * 6
    for reports in range(1, 5):
        assert _cancelled(policy, {"a": _h(*leader[:reports]), "b": _h(*[0.1] * reports)}) == {}
    assert _cancelled(policy, {"a": _h(*leader[:5]), "b": _h(*[0.1] * 5)}) == {"b": 5}
    # 91%: 0.9/1.1 = 0.818 is allowed, 0.81 is not.
    assert _cancelled(policy, {"a": _h(*leader), "b": _h(*[0.82] * 6), "c": _h(*[0.81] * 6)}) == {"c": 6}


@pytest.mark.parametrize(("interval", "delay", "points"), [
    (1, 0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
    (1, 5, [5, 6, 7, 8, 9, 10]),
    (2, 5, [6, 8, 10]),  # every multiple of evaluation_interval that is >= delay_evaluation
    (3, 0, [3, 6, 9]),
    (0, 0, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),  # azure-ai-ml's default 0 acts as every report
    (5, 10, [10]),
])
def test_policies_apply_at_multiples_of_the_interval_from_the_delay_on(interval: int, delay: int, points: list[int]) -> None:
    for cls, extra in ((BanditPolicy, {"slack_factor": 0.1}), (MedianStoppingPolicy, {}),
                       (TruncationSelectionPolicy, {"truncation_percentage": 10})):
        policy = cls(evaluation_interval=interval, delay_evaluation=delay, **extra)
        assert [n for n in range(1, 11) if policy.evaluates_at(n)] == points


def test_between_evaluation_points_a_trial_is_judged_at_its_latest_point_only() -> None:
    policy = BanditPolicy(slack_factor=0.1, evaluation_interval=5)
    # b fell behind at report 7, but its standing is judged at 5 (where it was within slack) until 10.
    histories = {"a": _h(*[0.9] * 7), "b": _h(0.9, 0.9, 0.9, 0.9, 0.9, 0.1, 0.1)}
    assert _cancelled(policy, histories) == {}
    assert _cancelled(policy, {"a": _h(*[0.9] * 10), "b": _h(*[0.1] * 10)}) == {"b": 10}


def test_a_younger_trial_is_compared_with_the_others_values_at_its_own_report_count() -> None:
    policy = BanditPolicy(slack_factor=0.1)
    # old improved to 0.9 by report 10, but at report 3 it had 0.5: young's 0.5 at 3 is as good.
    histories = {"old": _h(0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9), "young": _h(0.2, 0.4, 0.5)}
    assert _cancelled(policy, histories) == {}
    # A trial with no report at interval n is not part of the comparison at n.
    assert _cancelled(policy, {"a": _h(0.5, 0.5), "b": _h(0.9)}) == {}


def test_seen_judges_each_interval_once_and_catches_points_passed_between_calls() -> None:
    policy = BanditPolicy(slack_factor=0.1, evaluation_interval=2)
    histories = {"a": _h(0.5, 0.5, 0.9, 0.9), "b": _h(0.5, 0.5, 0.5, 0.5)}
    assert _cancelled(policy, histories, seen={"a": 0, "b": 0}) == {"b": 4}  # 2 passed, 4 failed
    assert _cancelled(policy, histories, seen={"a": 4, "b": 4}) == {}  # nothing new reported


# --- median stopping ---

def test_median_stopping_docs_example_best_worse_than_median_of_running_averages() -> None:
    # MedianStoppingPolicy(delay_evaluation=5, evaluation_interval=1): at interval 5 a trial stops when its
    # best over 1..5 is worse than the median of all trials' running averages over 1..5.
    policy = MedianStoppingPolicy(delay_evaluation=5, evaluation_interval=1)
    histories = {
        "a": _h(0.5, 0.6, 0.7, 0.8, 0.9),   # average 0.7
        "b": _h(0.6, 0.6, 0.6, 0.6, 0.6),   # average 0.6, best 0.6
        "c": _h(0.4, 0.5, 0.5, 0.5, 0.6),   # average 0.5, best 0.6
        "d": _h(0.3, 0.3, 0.3, 0.3, 0.35),  # average 0.31, best 0.35
    }
    # The median of (0.7, 0.6, 0.5, 0.31) is 0.55: only d's best (0.35) is worse.
    decisions = to_cancel(policy, histories, "maximize")
    assert [(d.trial, d.interval) for d in decisions] == [("d", 5)]
    assert decisions[0].reason == ("median_stopping: trial's best 0.35 at interval 5 is worse than 0.55, "
                                   "the median of 4 trials' running averages over intervals 1-5")
    assert _cancelled(policy, {k: _h(*v.reports[:4]) for k, v in histories.items()}) == {}  # before the delay


def test_median_stopping_minimize_and_a_lone_trial_is_never_stopped() -> None:
    policy = MedianStoppingPolicy()
    histories = {"a": _h(1.0, 0.5), "b": _h(1.0, 0.9), "c": _h(2.0, 1.8)}
    # Averages 0.75, 0.95, 1.9 -> median 0.95; c's best 1.8 is worse (higher).
    assert _cancelled(policy, histories, "minimize") == {"c": 2}
    assert _cancelled(policy, {"only": _h(0.1, 0.1, 0.1)}) == {}  # its average, 0.1 but for rounding, is its best


# --- truncation selection ---

def _five(finished_lowest: bool = False) -> dict[str, TrialHistory]:
    return {"a": _h(*[0.9] * 5), "b": _h(*[0.8] * 5), "c": _h(*[0.7] * 5), "d": _h(*[0.6] * 5),
            "e": _h(*[0.5] * 5, status="completed" if finished_lowest else "running")}


def test_truncation_docs_example_lowest_20_percent_at_interval_5() -> None:
    policy = TruncationSelectionPolicy(truncation_percentage=20, evaluation_interval=1, delay_evaluation=5)
    decisions = to_cancel(policy, _five(), "maximize")
    assert [(d.trial, d.interval) for d in decisions] == [("e", 5)]
    assert decisions[0].reason == ("truncation_selection: trial's 0.5 at interval 5 ranks 1 from the bottom of "
                                   "5 trials, within the lowest 20% (1)")
    assert _cancelled(policy, {k: _h(*v.reports[:4]) for k, v in _five().items()}) == {}  # before the delay


def test_truncation_ranks_finished_trials_unless_excluded() -> None:
    kept = TruncationSelectionPolicy(truncation_percentage=20)
    assert _cancelled(kept, _five(finished_lowest=True)) == {}  # the lowest 20% is the finished e
    excluded = TruncationSelectionPolicy(truncation_percentage=20, exclude_finished_jobs=True)
    # Without e, 4 trials: 20% of 4 rounds down to none; 40% of 4 is one, d.
    assert _cancelled(excluded, _five(finished_lowest=True)) == {}
    wider = TruncationSelectionPolicy(truncation_percentage=40, exclude_finished_jobs=True)
    assert _cancelled(wider, _five(finished_lowest=True)) == {"d": 5}


def test_truncation_minimize_cancels_the_highest() -> None:
    policy = TruncationSelectionPolicy(truncation_percentage=50)
    histories = {"a": _h(0.1), "b": _h(0.2), "c": _h(0.3), "d": _h(0.4)}
    assert _cancelled(policy, histories, "minimize") == {"c": 1, "d": 1}


def test_no_policy_cancels_nothing_and_a_bad_goal_is_refused() -> None:
    assert to_cancel(None, _five(), "maximize") == []
    with pytest.raises(ConfigError, match=r"^objective.goal: must be maximize or minimize, got 'best'$"):
        to_cancel(BanditPolicy(slack_factor=0.1), _five(), "best")


def test_history_takes_mlflow_step_value_pairs_and_skips_non_finite_values() -> None:
    assert TrialHistory.of([(0, 0.5), (0, 0.6), (1, float("nan"))], "Running") == TrialHistory((0.5, 0.6), "Running")
    assert TrialHistory.of([0.5]).running and not TrialHistory.of([0.5], "Completed").running


# --- parsing: YAML and REST to the same value, and each refusal in one line ---

@pytest.mark.parametrize(("yaml_form", "rest_form", "expected"), [
    ({"type": "bandit", "slack_factor": 0.1, "evaluation_interval": 1, "delay_evaluation": 5},
     {"policyType": "Bandit", "slackFactor": 0.1, "slackAmount": 0, "evaluationInterval": 1, "delayEvaluation": 5},
     BanditPolicy(slack_factor=0.1, evaluation_interval=1, delay_evaluation=5)),
    ({"type": "bandit", "slack_amount": 0.2},
     {"policyType": "Bandit", "slackAmount": 0.2},
     BanditPolicy(slack_amount=0.2)),
    ({"type": "median_stopping", "evaluation_interval": 2, "delay_evaluation": 5},
     {"policyType": "MedianStopping", "evaluationInterval": 2, "delayEvaluation": 5},
     MedianStoppingPolicy(evaluation_interval=2, delay_evaluation=5)),
    ({"type": "truncation_selection", "truncation_percentage": 20, "evaluation_interval": None},
     {"policyType": "TruncationSelection", "truncationPercentage": 20},
     TruncationSelectionPolicy(truncation_percentage=20)),
])
def test_yaml_and_rest_parse_to_the_same_policy_and_round_trip(yaml_form, rest_form, expected) -> None:
    assert policy_from_yaml(yaml_form) == policy_from_rest(rest_form) == expected
    assert policy_from_yaml(expected.to_yaml()) == policy_from_rest(expected.to_rest()) == expected
    assert POLICIES[expected.type] is type(expected)


def test_the_rest_shape_azure_ai_ml_sends_for_its_defaults() -> None:
    # BanditPolicy(slack_factor=0.1) from azure-ai-ml: both slacks (0 for the one not set), interval 0.
    sent = {"delayEvaluation": 0, "evaluationInterval": 0, "slackFactor": 0.1, "slackAmount": 0, "policyType": "Bandit"}
    policy = policy_from_rest(sent)
    assert policy == BanditPolicy(slack_factor=0.1, evaluation_interval=0)
    assert policy.to_rest() == {"policyType": "Bandit", "evaluationInterval": 0, "delayEvaluation": 0,
                                "slackFactor": 0.1, "slackAmount": 0.0}
    assert policy_from_yaml(None) is policy_from_rest(None) is None


def test_sdk_v1_hyperdrive_policies() -> None:
    v1 = {"name": "TruncationSelection", "properties": {"evaluation_interval": 1, "delay_evaluation": 5,
                                                        "truncation_percentage": 20, "exclude_finished_jobs": False}}
    assert policy_from_v1(v1) == TruncationSelectionPolicy(truncation_percentage=20, delay_evaluation=5)
    assert policy_from_v1({"name": "Bandit", "properties": {"evaluation_interval": 1, "slack_factor": 0.1,
                                                            "delay_evaluation": 0}}) == BanditPolicy(slack_factor=0.1)
    assert policy_from_v1({"name": "Default"}) is None


@pytest.mark.parametrize(("parse", "data", "message"), [
    (policy_from_yaml, {"type": "bandit"},
     "early_termination.slack_factor: a bandit policy needs slack_factor or slack_amount; give exactly one, e.g. slack_factor: 0.1"),
    (policy_from_yaml, {"type": "bandit", "slack_factor": 0.1, "slack_amount": 0.2},
     "early_termination.slack_amount: set together with slack_factor; give exactly one of slack_factor (a ratio) "
     "or slack_amount (an absolute distance)"),
    (policy_from_rest, {"policyType": "Bandit", "slackFactor": 0.1, "slackAmount": 0.2},
     "earlyTermination.slackAmount: set together with slackFactor; give exactly one of slackFactor (a ratio) "
     "or slackAmount (an absolute distance)"),
    (policy_from_yaml, {"type": "bandit", "slack_factor": -0.1}, "early_termination.slack_factor: must be 0 or more, got -0.1"),
    (policy_from_yaml, {"type": "median_stopping", "evaluation_interval": -1},
     "early_termination.evaluation_interval: must be 0 or more, got -1"),
    (policy_from_rest, {"policyType": "MedianStopping", "delayEvaluation": 1.5},
     "earlyTermination.delayEvaluation: must be an integer, got 1.5"),
    (policy_from_yaml, {"type": "truncation_selection", "truncation_percentage": 0},
     "early_termination.truncation_percentage: must be an integer between 1 and 99, got 0; "
     "the percentage of lowest performing trials to cancel at each evaluation"),
    (policy_from_rest, {"policyType": "TruncationSelection", "truncationPercentage": 100},
     "earlyTermination.truncationPercentage: must be an integer between 1 and 99, got 100; "
     "the percentage of lowest performing trials to cancel at each evaluation"),
    (policy_from_yaml, {"type": "truncation_selection"},
     "early_termination.truncation_percentage: must be an integer between 1 and 99, got 0; "
     "the percentage of lowest performing trials to cancel at each evaluation"),
    (policy_from_yaml, {"type": "truncation_selection", "truncation_percentage": 20, "exclude_finished_jobs": True},
     "early_termination.exclude_finished_jobs: unknown field; az ml's sweep YAML has no exclude_finished_jobs "
     "(only SDK v1's TruncationSelectionPolicy sends it, always false): remove it"),
    (policy_from_yaml, {"type": "bandit", "slack_factor": 0.1, "slack": 1},
     "early_termination.slack: unknown field; known fields: delay_evaluation, evaluation_interval, slack_amount, "
     "slack_factor, type"),
    (policy_from_yaml, {"type": "hyperband"},
     "early_termination.type: unknown early termination policy 'hyperband'; use one of bandit, median_stopping, "
     "truncation_selection"),
    (policy_from_yaml, "bandit", "early_termination: must be a mapping, got str"),
    (policy_from_rest, {"slackFactor": 0.1},
     "earlyTermination.policyType: required; use one of Bandit, MedianStopping, TruncationSelection"),
    (policy_from_v1, {"name": "Hyperband"},
     "policy.name: unknown early termination policy 'Hyperband'; use BanditPolicy, MedianStoppingPolicy, "
     "TruncationSelectionPolicy or NoTerminationPolicy"),
])
def test_each_bad_policy_is_refused_in_one_line(parse, data, message) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    assert str(caught.value) == message


def test_a_policy_built_in_python_is_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"^early_termination.slack_factor: a bandit policy needs"):
        BanditPolicy()
    with pytest.raises(TypeError):
        BanditPolicy(0.1)  # keyword-only: a positional slack would land in evaluation_interval


# --- objective and limits ---

def test_objective_from_yaml_and_rest_is_the_same() -> None:
    yaml_form = Objective.from_yaml({"goal": "maximize", "primary_metric": "accuracy"})
    assert yaml_form == Objective.from_rest({"goal": "Maximize", "primaryMetric": "accuracy"}) == \
        Objective.from_rest({"goal": "maximize", "primaryMetric": "accuracy"})  # azure-ai-ml sends lower case
    assert yaml_form.to_rest() == {"goal": "Maximize", "primaryMetric": "accuracy"}
    assert Objective.from_yaml(yaml_form.to_yaml()) == yaml_form
    assert yaml_form.better(0.9, 0.8) and Objective("Minimize", "loss").better(0.1, 0.2)


@pytest.mark.parametrize(("parse", "data", "message"), [
    (Objective.from_yaml, None, "objective: required; e.g. objective: {goal: maximize, primary_metric: accuracy}"),
    (Objective.from_yaml, {"goal": "max", "primary_metric": "acc"}, "objective.goal: must be maximize or minimize, got 'max'"),
    (Objective.from_yaml, {"goal": "maximize"},
     "objective.primary_metric: required; e.g. objective: {goal: maximize, primary_metric: accuracy}"),
    (Objective.from_yaml, {"goal": "maximize", "primary_metric": "acc", "metric": "x"},
     "objective.metric: unknown field; known fields: goal, primary_metric"),
    (Objective.from_rest, {"goal": "Maximize", "primaryMetric": ""},
     "objective.primaryMetric: must be a non-empty string, got ''"),
])
def test_each_bad_objective_is_refused_in_one_line(parse, data, message) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    assert str(caught.value) == message


def test_limits_from_yaml_and_rest_are_the_same_and_round_trip() -> None:
    yaml_form = SweepLimits.from_yaml({"max_total_trials": 20, "max_concurrent_trials": 4, "timeout": 7200,
                                       "trial_timeout": 600})
    rest_form = SweepLimits.from_rest({"jobLimitsType": "Sweep", "maxTotalTrials": 20, "maxConcurrentTrials": 4,
                                       "timeout": "PT2H", "trialTimeout": "PT10M"})
    assert yaml_form == rest_form == SweepLimits(max_total_trials=20, max_concurrent_trials=4, timeout=7200,
                                                 trial_timeout=600)
    assert rest_form.to_rest() == {"jobLimitsType": "Sweep", "maxTotalTrials": 20, "maxConcurrentTrials": 4,
                                   "timeout": "PT2H", "trialTimeout": "PT10M"}
    assert SweepLimits.from_yaml(yaml_form.to_yaml()) == SweepLimits.from_rest(rest_form.to_rest()) == yaml_form


def test_limits_defaults_as_azure_ml_documents_them() -> None:
    default = SweepLimits.from_rest(None)  # the SDK sent no limits
    assert (default.max_total_trials, default.concurrency, default.sweep_timeout, default.trial_timeout) == \
        (1000, 1000, DEFAULT_TIMEOUT_S, None)
    assert SweepLimits.from_yaml({"max_total_trials": 8}).concurrency == 8  # defaults to max_total_trials
    assert SweepLimits.from_yaml({"max_total_trials": 2, "max_concurrent_trials": 4}).concurrency == 2
    # As azure-ai-ml sends them: 1-59 s become 60 s, 0 is no timeout.
    assert SweepLimits.from_yaml({"max_total_trials": 2, "timeout": 30, "trial_timeout": 0}) == \
        SweepLimits(max_total_trials=2, timeout=60)


@pytest.mark.parametrize(("parse", "data", "message"), [
    (SweepLimits.from_yaml, None, "limits: required; e.g. limits: {max_total_trials: 20, max_concurrent_trials: 4}"),
    (SweepLimits.from_yaml, {"max_concurrent_trials": 2},
     "limits.max_total_trials: required; the most trials the sweep runs, 1 to 1000"),
    (SweepLimits.from_yaml, {"max_total_trials": 5000},
     "limits.max_total_trials: must be an integer between 1 and 1000, got 5000; Azure ML's limit"),
    (SweepLimits.from_rest, {"maxTotalTrials": 4, "maxConcurrentTrials": 0},
     "limits.maxConcurrentTrials: must be an integer between 1 and 1000, got 0; Azure ML's limit"),
    (SweepLimits.from_yaml, {"max_total_trials": 4, "timeout": -5}, "limits.timeout: must be 0 or more, got -5"),
    (SweepLimits.from_yaml, {"max_total_trials": 4, "timeout": "2h"}, "limits.timeout: must be an integer, got '2h'"),
    (SweepLimits.from_yaml, {"max_total_trials": 4, "max_runs": 4},
     "limits.max_runs: unknown field; known fields: max_concurrent_trials, max_total_trials, timeout, trial_timeout"),
    (SweepLimits.from_rest, {"maxTotalTrials": 4, "timeout": "P1M"},
     "limits.timeout: not an ISO-8601 duration: 'P1M'; give days, hours, minutes and seconds, e.g. PT2H or P1DT30M"),
    (SweepLimits.from_rest, {"jobLimitsType": "Command", "maxTotalTrials": 4},
     "limits.jobLimitsType: must be Sweep for a sweep job, got 'Command'"),
])
def test_each_bad_limit_is_refused_in_one_line(parse, data, message) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    assert str(caught.value) == message


@pytest.mark.parametrize(("text", "seconds"), [
    ("PT2H", 7200), ("PT10M", 600), ("PT1M30S", 90), ("P60D", 5184000), ("P1DT1H", 90000), ("PT1H1M1S", 3661),
    ("P1W", 604800),
])
def test_iso_8601_durations(text: str, seconds: int) -> None:
    assert parse_duration(text, "limits.timeout") == seconds
    if "W" not in text:
        assert format_duration(seconds) == text  # isodate's spelling, as azure-ai-ml sends it
    assert parse_duration("PT1.5S", "t") == 1 and parse_duration(120, "t") == 120
    for bad in ("PT", "P", "2H", "PT2X", "P1Y"):
        with pytest.raises(ConfigError, match=r"^t: not an ISO-8601 duration"):
            parse_duration(bad, "t")
