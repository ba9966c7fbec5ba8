"""Azure ML's v1 runtime starts a job's script through `azureml-setup/context_manager_injector.py`
in the working folder; its context managers send the run's history when the script ends. amlemu
copies this file there for a v1 job (runs/rundisk.py) and runs the script through it
(contract.resolve_command), for the one thing scripts rely on: metrics logged with azureml-core's
`Run.log*` reach the run even when the script never calls `run.flush()` (they are sent in the
background, and a process that just ends drops what is still queued).

It runs in the job's own Python, so it imports nothing but the standard library.
"""
import os
import runpy
import sys


def flush_runs() -> None:
    """Every run object the script made (azureml-core keeps one per run, per process) sends what it queued."""
    module = sys.modules.get("azureml.core.run")
    submitted = getattr(module, "_SubmittedRun", None)
    for run in list(getattr(submitted, "_SubmittedRun__instances", {}).values()):
        try:
            run.flush()
        except Exception as exc:  # noqa: BLE001 - the script's own outcome stands
            print(f"context_manager_injector: flushing run {getattr(run, 'id', '?')} failed: {exc}", file=sys.stderr)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python azureml-setup/context_manager_injector.py <script.py> [arguments...]")
    sys.argv = sys.argv[1:]  # the script sees itself as argv[0], as `python script.py` shows it
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # and its folder first, not this one's
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        flush_runs()


if __name__ == "__main__":
    main()
