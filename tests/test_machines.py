"""Machines (issue 31): the Docker engines a home may place nodes on. Addresses checked before any
connection, the registry in the home's state database with `local` always there, `amlemu machine
add|list|remove` against this machine's real engine, and `compute create --machines`."""
from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from click.testing import CliRunner

from amlemu.actions import execute
from amlemu.cli import cli
from amlemu.cluster.records import SCHEMA_VERSION
from amlemu.cluster.store import Store
from amlemu.errors import ConfigError, MachineError, NotFoundError, StateError
from amlemu.machines import engines, registry
from amlemu.machines.address import TlsFiles, check_address, tls_files
from amlemu.machines.registry import Machine
from amlemu.specs import ClusterSpec
from amlemu.targets.azureml import AzureMLTarget, WorkspaceRef

SOCKET = "unix:///var/run/docker.sock"  # this machine's engine, as Docker names it by default
UUID = "GPU-3b4c1c2e-5d7d-8a9b-1c2d-3e4f5a6b7c8d"
TLS = TlsFiles("/ca.pem", "/cert.pem", "/key.pem")


# --- addresses (pure) ------------------------------------------------------------------------------
@pytest.mark.parametrize("address,tls,expected", [
    ("unix:///var/run/docker.sock", None, "unix:///var/run/docker.sock"),
    ("UNIX:///run/user/1000/docker.sock", None, "unix:///run/user/1000/docker.sock"),
    ("ssh://me@gpu-box", None, "ssh://me@gpu-box"),
    ("ssh://me@gpu-box.lan:2222", None, "ssh://me@gpu-box.lan:2222"),
    ("ssh://ci_runner@10.0.0.7", None, "ssh://ci_runner@10.0.0.7"),
    ("ssh://me@[fd00::7]:22", None, "ssh://me@[fd00::7]:22"),
    ("tcp://gpu-box:2376", TLS, "tcp://gpu-box:2376"),
])
def test_the_three_address_forms_docker_names(address: str, tls: TlsFiles | None, expected: str) -> None:
    assert check_address(address, tls) == expected


@pytest.mark.parametrize("address,tls,says", [
    ("tcp://gpu-box:2375", None, "plain tcp: an unencrypted Docker socket gives root on that machine"),
    ("tcp://gpu-box", TLS, "tcp:// is host:port"),
    ("tcp://me@gpu-box:2376", TLS, "tcp:// is host:port, with no user"),
    ("ssh://gpu-box", None, "ssh:// needs the user to log in as"),
    ("ssh://me:secret@gpu-box", None, "no password"),
    ("ssh://me@gpu-box:99999", None, "the port is not a number from 1 to 65535"),
    ("ssh://me@gpu-box/var/run/docker.sock", None, "nothing may follow the host and port"),
    ("ssh://me@bad_host!", None, "is not a host name or IP address"),
    ("ssh://-oProxyCommand=x@host", None, "ssh:// needs the user"),
    ("unix://docker.sock", None, "absolute path"),
    ("unix:///run/../etc/docker.sock", None, "absolute path"),
    ("npipe:////./pipe/docker_engine", None, "the scheme must be one of unix://, ssh://, tcp://"),
    ("http://gpu-box:2375", None, "the scheme must be one of"),
    ("gpu-box:2376", None, "the scheme must be one of"),
    ("ssh://me@host\nx", None, "not an engine address"),
    ("", None, "not an engine address"),
    ("ssh://me@gpu-box", TLS, "TLS files are for tcp:// engines"),
])
def test_a_bad_address_is_one_line_naming_the_fix(address: str, tls: TlsFiles | None, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_address(address, tls)
    message = str(raised.value)
    assert says in message and "\n" not in message
    assert "tcp://" in message  # each says the forms (or, for plain tcp, how to serve TLS)


def test_tls_files_come_all_three_or_none() -> None:
    assert tls_files(None, None, None) is None
    assert tls_files("/a", "/b", "/c") == TlsFiles("/a", "/b", "/c")
    with pytest.raises(ConfigError, match="--tls-key: missing; give --tls-ca, --tls-cert and --tls-key together"):
        tls_files("/a", "/b", None)


def test_gpu_uuids_given_and_read_from_nvidia_smi() -> None:
    assert engines.check_gpu_uuids(f"{UUID}, MIG-{UUID[4:]}") == (UUID, f"MIG-{UUID[4:]}")
    assert engines.check_gpu_uuids(None) == ()
    for bad, says in (("0,1", "is not a GPU UUID"), (f"{UUID},{UUID}", "named twice")):
        with pytest.raises(ConfigError, match=f"--gpus: .*{says}"):
            engines.check_gpu_uuids(bad)
    smi = "0, GPU-aaaa\n1, GPU-bbbb\n2, GPU-cccc\n"
    assert engines.parse_gpu_uuids(smi, None) == ("GPU-aaaa", "GPU-bbbb", "GPU-cccc")
    assert engines.parse_gpu_uuids(smi, "2,0") == ("GPU-aaaa", "GPU-cccc")  # CUDA_VISIBLE_DEVICES by index
    assert engines.parse_gpu_uuids(smi, "GPU-bb") == ("GPU-bbbb",)  # or by (a prefix of) UUID
    assert engines.parse_gpu_uuids(smi, "") == ()


# --- the registry ----------------------------------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "amlemu.db")
    yield opened
    opened.close()


def local() -> Machine:
    return Machine("local", SOCKET, 2.0, 8 << 30)


def m2(name: str = "m2", address: str = "ssh://me@m2.invalid") -> Machine:
    return Machine(name, address, 16.0, 64 << 30, (UUID,), 1.0, None, "ENGINE-2")


def test_machines_are_stored_with_local_always_first(store: Store) -> None:
    assert registry.machines(store, local) == [local()] and registry.stored(store) == []
    execute(registry.plan_add(store, m2("zz", "ssh://me@zz.invalid")))
    execute(registry.plan_add(store, m2()))
    assert [m.name for m in registry.machines(store, local)] == ["local", "m2", "zz"]
    assert registry.get(store, "m2", local) == m2()  # every field back as it went in, GPUs a tuple
    with pytest.raises(NotFoundError, match="machine 'nope' not found; known: local, m2, zz"):
        registry.get(store, "nope", local)


def test_a_machine_with_tls_files_round_trips(store: Store) -> None:
    machine = Machine("tls", "tcp://m3.invalid:2376", 4.0, 1 << 30, (), 2.0, TLS)
    execute(registry.plan_add(store, machine))
    assert registry.get(store, "tls", local) == machine


def test_a_name_or_address_taken_and_local_are_refused_before_any_engine_is_asked(store: Store) -> None:
    execute(registry.plan_add(store, m2()))
    with pytest.raises(StateError, match="machine 'm2' already exists"):
        registry.check_new(store, "m2", "ssh://me@other.invalid")
    with pytest.raises(StateError, match="is machine 'm2' already"):
        registry.check_new(store, "other", "ssh://me@m2.invalid")
    with pytest.raises(ConfigError, match="'local' is this machine's engine"):
        registry.check_new(store, "local", "ssh://me@x.invalid")
    for bad in ("all", "M2", "2box", "a_b", "x" * 33):
        with pytest.raises(ConfigError, match="is not a valid machine name"):
            registry.check_new(store, bad, "ssh://me@x.invalid")


def test_remove_forgets_a_machine_but_never_local_nor_one_in_use(store: Store) -> None:
    execute(registry.plan_add(store, m2()))
    with pytest.raises(StateError, match="'local' is this machine's engine: it is always there"):
        registry.plan_remove(store, "local")
    with pytest.raises(StateError, match="in use by compute c1, c2; delete those computes first"):
        registry.plan_remove(store, "m2", ["c1", "c2"])
    with pytest.raises(NotFoundError):
        registry.plan_remove(store, "m9")
    plan = registry.plan_remove(store, "m2")
    assert [a.to_dict() for a in plan] == [{"action": "remove", "what": "machine", "name": "m2",
                                            "address": "ssh://me@m2.invalid"}]
    assert registry.stored(store) == [m2()]  # a plan changes nothing until it is carried out
    execute(plan)
    assert registry.stored(store) == []


def test_a_computes_machines_are_checked_at_create_time(store: Store) -> None:
    execute(registry.plan_add(store, m2(address="unix:///run/m2.sock")))  # ssh:// is refused (test_multimachine)
    assert registry.resolve(store, ("all",)) == ("local", "m2")  # every machine known now
    assert registry.resolve(store, ("m2",)) == ("m2",)
    with pytest.raises(ConfigError, match=r"--machines: no machine named m3, m4; known machines: local, m2"):
        registry.resolve(store, ("m2", "m3", "m4"))
    registry.check_backend(("local",), "process")
    with pytest.raises(ConfigError, match="use --backend docker"):
        registry.check_backend(("local", "m2"), "process")
    spec = ClusterSpec("c1", machines=["local", "m2"], placement="pack")  # a list, as JSON gives it back
    assert spec.machines == ("local", "m2")
    with pytest.raises(ConfigError, match="placement: 'fill' is not a placement"):
        ClusterSpec("c1", placement="fill")


def test_the_azureml_target_refuses_machines_azure_places_nodes_itself() -> None:
    target = AzureMLTarget(workspace=WorkspaceRef("s", "g", "w"))
    with pytest.raises(ConfigError, match="--machines: Azure ML places a compute's nodes itself"):
        target.plan_compute(ClusterSpec("c1", machines=("local",)))


def test_the_schema_version_says_machines_and_cleanup_keeps_them(store: Store, tmp_path: Path) -> None:
    execute(registry.plan_add(store, m2()))
    with sqlite3.connect(tmp_path / "amlemu.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    store.reset(keep_data=True)  # `amlemu cleanup`: runs and computes go, machines stay
    assert registry.stored(store) == [m2()]
    store.reset(keep_data=False)  # `cleanup --all`
    assert registry.stored(store) == []


# --- engines ---------------------------------------------------------------------------------------
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def not_ssh() -> Iterator[int]:
    """A loopback port that answers, but not as an ssh server: each connection is closed at once."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
            conn.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept() the thread waits in
    server.close()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_an_engine_that_is_not_there_is_one_line_naming_the_address(tmp_path: Path, not_ssh: int) -> None:
    port = closed_port()
    pems = TlsFiles(*(str(tmp_path / f"{name}.pem") for name in ("ca", "cert", "key")))
    for path in pems.paths().values():
        Path(path).write_text("-----BEGIN CERTIFICATE-----\n")  # read only once a TLS connection is made
    cases = [(f"unix://{tmp_path}/docker.sock", None, f"no socket at {tmp_path}/docker.sock"),
             (f"ssh://me@127.0.0.1:{port}", None, f"cannot reach 127.0.0.1 port {port}"),
             (f"tcp://127.0.0.1:{port}", pems, f"cannot reach 127.0.0.1 port {port}"),
             # the ssh transport is there (paramiko): it fails on the server, not for want of a library
             (f"ssh://me@127.0.0.1:{not_ssh}", None, "no Docker engine answers (SSHException")]
    for address, tls, says in cases:
        with pytest.raises(MachineError) as raised:
            engines.connect(address, tls, timeout=10)
        assert str(raised.value).startswith(f"{address}: ") and says in str(raised.value), raised.value
        assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match="--tls-ca: /ca.pem: no such file"):
        engines.connect(f"tcp://127.0.0.1:{port}", TLS)


# --- the command line, against this machine's engine ----------------------------------------------
def amlemu(home: Path, *argv: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--home", str(home), *argv], env={"AMLEMU_TARGET": "", "AMLEMU_DEBUG": ""})
    return result.exit_code, result.stdout, result.stderr


def test_machine_add_list_remove_and_a_compute_on_machines(home: Path) -> None:
    ncpu = docker.from_env().info()["NCPU"]
    code, out, err = amlemu(home, "machine", "add", "same", SOCKET, "--gpus", UUID, "--dry-run", "-o", "json")
    assert code == 0, err
    [action] = json.loads(out)["actions"]  # the record it would store, and nothing stored
    assert action["action"] == "add" and action["name"] == "same" and action["cores"] == ncpu
    assert action["gpus"] == [UUID] and action["address"] == SOCKET
    assert "is the engine of machine local too" in err  # the same engine under two names is said
    assert json.loads(amlemu(home, "machine", "list", "-o", "json")[1])[1:] == []

    code, out, err = amlemu(home, "machine", "add", "same", SOCKET, "--gpus", UUID)
    assert code == 0 and f"added machine same: {SOCKET}, {ncpu} cores" in out, err
    listed = json.loads(amlemu(home, "machine", "list", "-o", "json")[1])
    assert [(m["name"], m["cores"], m["gpus"]) for m in listed] == [("local", listed[0]["cores"], listed[0]["gpus"]),
                                                                    ("same", ncpu, [UUID])]
    assert "same" in amlemu(home, "machine", "list")[1]
    code, _, err = amlemu(home, "machine", "add", "same", "unix:///run/docker.sock")
    assert code == 1 and "machine 'same' already exists" in err

    code, _, err = amlemu(home, "compute", "create", "-n", "c1", "--machines", "same,m9", "--backend", "docker")
    assert code == 1 and "--machines: no machine named m9; known machines: local, same" in err
    code, out, err = amlemu(home, "compute", "create", "-n", "c1", "--machines", "all", "--placement", "pack",
                            "--backend", "docker", "--dry-run", "-o", "json")
    assert code == 0 and json.loads(out)["compute"]["machines"] == ["local", "same"], err
    code, out, err = amlemu(home, "compute", "create", "-n", "c2", "--machines", "local", "--backend", "process",
                            "-o", "json")
    assert code == 0 and json.loads(out)["machines"] == ["local"], err
    assert "on machines local (spread)" in amlemu(home, "compute", "show", "-n", "c2")[1]

    code, _, err = amlemu(home, "machine", "remove", "local", "--yes")
    assert code == 1 and "cannot be removed" in err and "\n" not in err.strip()
    code, out, _ = amlemu(home, "machine", "remove", "same", "--dry-run")
    assert code == 0 and f"remove machine same (address {SOCKET})" in out
    code, out, err = amlemu(home, "machine", "remove", "-n", "same", "--yes")
    assert code == 0 and "removed machine same" in out, err
    assert [m["name"] for m in json.loads(amlemu(home, "machine", "list", "-o", "json")[1])] == ["local"]


def test_machine_add_refuses_bad_input_before_it_connects(tmp_path: Path, not_ssh: int) -> None:
    home = tmp_path / "home"  # nothing is made in it: no cleanup to run
    home.mkdir()
    # As a user's shell runs it (no logging set up): paramiko's failed handshake is one line, no traceback.
    done = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), "machine", "add", "m3",
                           f"ssh://me@127.0.0.1:{not_ssh}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.startswith("amlemu: error: ssh://me@127.0.0.1:"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "SSHException" in done.stderr, done.stderr
    for argv, says in ((("m3", "tcp://10.9.9.9:2375"), "plain tcp"),
                       (("m3", "unix:///nonexistent/docker.sock"), "no socket at /nonexistent/docker.sock"),
                       (("local", SOCKET), "'local' is this machine's engine"),
                       (("m3", SOCKET, "--gpus", "0"), "--gpus: '0' is not a GPU UUID"),
                       (("m3", "ssh://me@x.invalid", "--tls-ca", "/ca.pem"), "--tls-cert: missing")):
        code, _, err = amlemu(home, "machine", "add", *argv)
        assert code == 1 and says in err and len(err.strip().splitlines()) == 1, err
