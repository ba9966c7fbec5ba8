"""`amlemu serve` and `amlemu env`: Azure ML's own API on this machine, for unmodified azure-ai-ml code.

    eval "$(amlemu env)"        # starts the service when it is not running, prints the variables
    python submit.py            # MLClient(...).jobs.create_or_update(job) runs on the emulator

The service (emulator/service/) is imported only by these commands: the others stay quick.
"""
from __future__ import annotations

import json
import shlex
import sys

import click

from amlemu import servicefile
from amlemu.cli.common import cli, console, err_console, handle_errors
from amlemu.errors import ConfigError

FORMATS = ("sh", "dotenv", "json", "powershell")


def render_env(variables: dict[str, str], fmt: str) -> str:
    """The variables in the shape each shell or tool reads."""
    if fmt == "json":
        return json.dumps(variables, indent=2) + "\n"
    if fmt == "powershell":
        return "".join(f"$env:{k} = '{v.replace(chr(39), chr(39) * 2)}'\n" for k, v in variables.items())
    if fmt == "dotenv":
        return "".join(f"{k}={json.dumps(v) if any(c in v for c in ' #=&?') else v}\n" for k, v in variables.items())
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in variables.items())


port_option = click.option("--port", type=click.IntRange(0, 65535), default=servicefile.DEFAULT_PORT,
                           show_default=True, help="port to listen on (0: any free port)")


@cli.command("serve")
@port_option
@click.option("--allow-remote", is_flag=True,
              help="listen on every interface (0.0.0.0), not only loopback; every request still needs a token "
                   "the service issued")
@click.option("--stop", is_flag=True, help="stop the home's running service and exit")
@click.pass_context
@handle_errors
def serve(ctx: click.Context, port: int, allow_remote: bool, stop: bool) -> None:
    """Run Azure ML's API for this home, in the foreground until Ctrl-C: point azure-ai-ml at it with
    `eval "$(amlemu env)"` (which also starts it in the background when it is not running)."""
    home = ctx.obj.home()
    if stop:
        state = servicefile.read_state(home.root)
        if servicefile.stop(home.root) is False:
            console.print("the service of this home is not running", highlight=False)
        else:
            console.print(f"stopped the service at {state.url if state else '?'}", highlight=False)
        return
    from amlemu.service.state.emulator import EmulatorState  # noqa: PLC0415 - the service loads only here
    from amlemu.service.mlflowmount import MlflowMount  # noqa: PLC0415
    from amlemu.service.protocol.routes import Context  # noqa: PLC0415
    from amlemu.service.server import serve_forever  # noqa: PLC0415
    from amlemu.studio.app import studio_mount  # noqa: PLC0415
    from amlemu.studio.gate import LOOPBACK_NAMES, home_key, login_url  # noqa: PLC0415
    from amlemu.service.server.tls import machine_names  # noqa: PLC0415

    host = "0.0.0.0" if allow_remote else "127.0.0.1"  # noqa: S104 - only with --allow-remote
    # The studio answers to loopback's names, and with --allow-remote to this machine's (its certificate's).
    hosts = LOOPBACK_NAMES | frozenset(machine_names()) if allow_remote else LOOPBACK_NAMES
    if allow_remote:
        err_console.print("warning: --allow-remote: the service listens on every interface; anyone who can reach "
                          f"this machine's port {port} can try it (each request needs a token the service issued, "
                          "from the IDENTITY_HEADER secret `amlemu env` prints; the studio page a login link)",
                          highlight=False)
    key = home_key(home.root)

    mlflow_server = MlflowMount(home.root)  # MLflow's tracking server for the online runs, at /mlflow

    def make_ctx(auth, log):  # type: ignore[no-untyped-def]
        made = Context(EmulatorState(ctx.obj(), log), auth, log=log)
        mlflow_server.bind(made)
        return made

    def announce(url: str) -> None:
        # The login link is a credential: to a terminal only, never into a log (a background
        # service's output is its service.log); `amlemu ui --link` gives one any time.
        studio = (f"a one-time login link (`amlemu ui --link` gives another): {login_url(key, url)}"
                  if sys.stderr.isatty() else f"{url}/studio/ (its login link: `amlemu ui --link`)")
        err_console.print(f"amlemu serve: {url} (Ctrl-C stops it; `eval \"$(amlemu env)\"` points azure-ai-ml at "
                          f"it)\nthe studio page: {studio}", highlight=False)

    serve_forever(home.root, make_ctx, host, port, allow_remote, announce,
                  extra_routes=[mlflow_server.route(), studio_mount(home, key, hosts)])


@cli.command("env")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="sh", show_default=True,
              help='sh: for eval "$(amlemu env)"; dotenv: a .env file; json; powershell: for Invoke-Expression')
@port_option
@click.option("--no-start", is_flag=True, help="do not start the service when it is not running (an error instead)")
@click.option("--fast-stream", is_flag=True,
              help="add AZUREML_RUN_POLLING_INTERVAL_MIN/MAX: azure-ai-ml's jobs.stream polls every second; "
                   "azureml-core (SDK v1) fails in Run.wait_for_completion with them set")
@click.pass_context
@handle_errors
def env(ctx: click.Context, fmt: str, port: int, no_start: bool,
        fast_stream: bool) -> None:
    """Print the environment variables that point azure-ai-ml and azure-identity (SDK v2) and
    azureml-core (SDK v1) at this home's service, starting it in the background when it is not
    running (`amlemu serve --stop` or `amlemu cleanup` stop it). They hold a credential (IDENTITY_HEADER): keep them out of logs."""
    from amlemu.service.server import client_env, start_background  # noqa: PLC0415

    home = ctx.obj.home()
    state = servicefile.read_state(home.root)
    if state is None:
        if no_start:
            raise ConfigError("--no-start", "the service of this home is not running", "start it with `amlemu serve`")
        state = start_background(home.root, port)
        err_console.print(f"started the service at {state.url} (pid {state.pid}; `amlemu serve --stop` stops it)",
                          highlight=False)
    click.echo(render_env(client_env(home.root, state, fast_stream), fmt), nl=False)
