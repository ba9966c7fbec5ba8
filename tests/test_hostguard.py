"""The host guard's rules as data (backends/hostguard.py): what a docker cluster's bridge lets
through to this machine, and how its rules are found again by home, cluster and run."""
from __future__ import annotations

from amlemu.backends import hostguard


def test_a_clusters_guard_lets_replies_through_above_a_reject_of_everything_else() -> None:
    rules = hostguard.guard_rules("br-0123456789ab", "amlemu:h1:c1")
    assert [(tool, rule[-1] if rule[-2] == "-j" else rule[rule.index("-j") + 1]) for tool, rule in rules] == [
        ("iptables", "ACCEPT"), ("iptables", "REJECT"), ("ip6tables", "REJECT")]
    accept = rules[0][1]
    assert accept[accept.index("--ctstate") + 1] == "ESTABLISHED,RELATED"  # only what this machine opened
    assert all(rule[:2] == ["-i", "br-0123456789ab"] for _, rule in rules)  # the bridge's traffic only
    # Inserted at the top of INPUT, last first: the accepted replies end above the REJECT.
    assert hostguard.insert_argv("iptables", rules[0][1])[:5] == ["iptables", "-w", "-I", "INPUT", "1"]


def test_a_runs_port_is_open_to_the_gateway_only_and_tagged_with_the_run() -> None:
    rule = hostguard.port_rule("br-0123456789ab", "172.18.0.1", 40123, hostguard.comment("h1", "c1", "run_1"))
    assert rule == ["-i", "br-0123456789ab", "-p", "tcp", "-d", "172.18.0.1", "--dport", "40123",
                    "-m", "comment", "--comment", "amlemu:h1:c1:run_1", "-j", "ACCEPT"]
    assert hostguard.bridge_name("0123456789abcdef0123") == "br-0123456789ab"  # as Docker names it


LISTING = """-P INPUT ACCEPT
-A INPUT -i br-aaaaaaaaaaaa -p tcp -d 172.18.0.1 --dport 40123 -m comment --comment amlemu:h1:c1:run_1 -j ACCEPT
-A INPUT -i br-aaaaaaaaaaaa -m comment --comment amlemu:h1:c1 -j REJECT --reject-with icmp-port-unreachable
-A INPUT -i br-bbbbbbbbbbbb -m comment --comment amlemu:h1:c10 -j REJECT --reject-with icmp-port-unreachable
-A INPUT -i br-cccccccccccc -m comment --comment amlemu:h2:c1 -j REJECT --reject-with icmp-port-unreachable
-A INPUT -i eth0 -m comment --comment "a user's own rule" -j ACCEPT
-A INPUT -p tcp --dport 22 -j ACCEPT
"""


def test_rules_are_found_by_home_cluster_and_run_and_never_a_users_own() -> None:
    def tags(prefix: str) -> list[str]:
        return [argv[argv.index("--comment") + 1] for argv in hostguard.delete_argvs("iptables", LISTING, prefix)]
    assert tags(hostguard.comment("h1", "c1", "run_1")) == ["amlemu:h1:c1:run_1"]
    assert tags(hostguard.comment("h1", "c1")) == ["amlemu:h1:c1:run_1", "amlemu:h1:c1"]  # not c10's
    assert tags(hostguard.comment("h1")) == ["amlemu:h1:c1:run_1", "amlemu:h1:c1", "amlemu:h1:c10"]
    assert len(tags(hostguard.comment())) == 4  # every home's (cleanup --all-homes), no user rule
    delete = hostguard.delete_argvs("iptables", LISTING, "amlemu:h2")[0]
    assert delete == ["iptables", "-w", "-D", "INPUT", "-i", "br-cccccccccccc", "-m", "comment", "--comment",
                      "amlemu:h2:c1", "-j", "REJECT", "--reject-with", "icmp-port-unreachable"]


def test_the_reaper_removes_the_rules_it_finds_when_it_runs_not_only_those_listed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A cleanup lists its steps, then stops supervisors, then reaps: a supervisor may open a run's
    port in between, and its rule must go too (a terminated benchmark left one)."""
    listed = hostguard.delete_argvs("iptables", LISTING, "amlemu:h1")
    monkeypatch.setattr(hostguard, "rules", lambda prefix: listed)
    removed: list[str] = []
    monkeypatch.setattr(hostguard, "remove", lambda prefix: removed.append(prefix) or 4)
    [step] = hostguard.plan_remove("amlemu:h1")
    assert (step.verb, step.what, step.name, len(step.detail["rules"]), step.always) == (
        "remove", "firewall rules", "amlemu:h1", 3, True)
    step.run()  # type: ignore[misc]
    assert removed == ["amlemu:h1"]  # whatever is there by then, found again
    monkeypatch.setattr(hostguard, "rules", lambda prefix: [])
    assert hostguard.plan_remove("amlemu:h1") == []  # nothing to say when nothing is there
