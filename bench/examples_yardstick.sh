#!/usr/bin/env bash
# Azure's own examples as a yardstick: every command and pipeline job of cli/jobs/basics in an
# Azure/azureml-examples checkout, run through the examples' own cli/run-job.sh with `az ml ...`
# going to amlemu, in a fresh emulator home (process backend) set up as the examples' bootstrap sets
# up a workspace. Prints a table: file, outcome (Completed, or Failed and its one-line reason; for a
# pipeline, each step's status and a failed step's reason), seconds. Sweep and automl files are
# listed as skipped (separate issues).
#
#   bench/examples_yardstick.sh [--home DIR] [--timeout S] [--only GLOB] PATH/TO/azureml-examples
#
# --home: an empty folder to use as the home (default: a new temporary one, removed at the end);
# --timeout: seconds one job may take through run-job.sh before it is cancelled (default 180;
# hello-interactive's command sleeps 600 s); --only: run only files matching GLOB (e.g. 'hello-iris*').
# Whatever happens, the home is cleaned (`amlemu cleanup --all --yes`): nothing is left running.
# Nothing of the checkout is changed or copied; jobs run from its cli/jobs/basics as Azure's CI does.
set -uo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
HOME_DIR="" TIMEOUT=180 ONLY="*" EXAMPLES=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --home) HOME_DIR=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "examples_yardstick: unknown option $1" >&2; usage ;;
        *) EXAMPLES=$1; shift ;;
    esac
done
[[ -n "$EXAMPLES" ]] || usage
EXAMPLES=$(cd "$EXAMPLES" && pwd) || exit 2
BASICS=$EXAMPLES/cli/jobs/basics
if [[ ! -f "$EXAMPLES/cli/run-job.sh" || ! -d "$BASICS" ]]; then
    echo "examples_yardstick: $EXAMPLES has no cli/run-job.sh or cli/jobs/basics (an azureml-examples checkout?)" >&2
    exit 2
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AMLEMU=$(command -v amlemu || echo "$REPO/.venv/bin/amlemu")
[[ -x "$AMLEMU" ]] || { echo "examples_yardstick: no amlemu on PATH or in $REPO/.venv" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/amlemu-yardstick.XXXXXX")
if [[ -z "$HOME_DIR" ]]; then
    HOME_DIR=$WORK/home
    mkdir "$HOME_DIR"
elif [[ -n "$(ls -A "$HOME_DIR" 2>/dev/null)" ]]; then
    echo "examples_yardstick: --home $HOME_DIR is not empty (the yardstick needs a fresh workspace)" >&2
    rm -rf "$WORK"; exit 2
else
    mkdir -p "$HOME_DIR" && HOME_DIR=$(cd "$HOME_DIR" && pwd)  # the jobs are created from another folder
fi
export AMLEMU_HOME=$HOME_DIR AMLEMU_BACKEND=process AMLEMU_TARGET=emulator AMLEMU
unset AMLEMU_AZURITE_DIR  # the home's own Azurite, stopped by its cleanup

finish() {
    "$AMLEMU" cleanup --all --yes >/dev/null 2>&1 || echo "examples_yardstick: cleanup failed: run amlemu --home $HOME_DIR cleanup --all --yes" >&2
    rm -rf "$WORK"  # the home too when it was ours
}
trap finish EXIT
trap 'exit 130' INT TERM

# `az ml <verb> ...` is `amlemu <verb> ...`: run-job.sh and the bootstrap scripts call az so.
az() { shift; "$AMLEMU" "$@"; }
export -f az

# --- the workspace, as the examples' bootstrap makes it --------------------------------------------
setup() {
    # infra/bootstrapping/bootstrap.sh: ensure_aml_compute "cpu-cluster" 0 20 "Standard_DS3_v2"
    az ml compute create --name cpu-cluster --type amlcompute --min-instances 0 --max-instances 20 \
        --size Standard_DS3_v2 --output none || return 1
    # infra/bootstrapping/copy-data.sh copies iris.csv (and others) to workspaceblobstore's
    # example-data/; here an iris-shaped CSV of our own (Azure's file is not fetched).
    mkdir -p "$WORK/example-data"
    python3 - "$WORK/example-data/iris.csv" <<'EOF' || return 1
import random, sys
random.seed(0)
rows = ["sepal_length,sepal_width,petal_length,petal_width,species"]
for species, means in (("setosa", (5.0, 3.4, 1.5, 0.2)), ("versicolor", (5.9, 2.8, 4.3, 1.3)),
                       ("virginica", (6.6, 3.0, 5.5, 2.0))):
    rows += [",".join(f"{m + random.uniform(-0.3, 0.3):.1f}" for m in means) + "," + species for _ in range(50)]
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
EOF
    "$AMLEMU" data upload "$WORK/example-data" azureml://datastores/workspaceblobstore/paths/example-data \
        -o none || return 1
    # .github/workflows/bootstrapping-resources.yml registers example-data/ as the file dataset
    # "sampledata" (azureml-core's Dataset.File); az ml's equivalent:
    az ml data create --name sampledata --type uri_folder \
        --path azureml://datastores/workspaceblobstore/paths/example-data --output none || return 1
    # local-folder-example and the others: the examples' own script (it ignores its own failures)
    if [[ -f "$EXAMPLES/infra/bootstrapping/create-datasets.sh" ]]; then
        bash "$EXAMPLES/infra/bootstrapping/create-datasets.sh"
    else
        (cd "$EXAMPLES" && az ml data create -f ./cli/jobs/pipelines-with-components/basics/4d_data_input/data.yml -o none)
    fi
    "$AMLEMU" data show -n local-folder-example --label latest -o none 2>/dev/null \
        || echo "examples_yardstick: data asset local-folder-example was not created" >&2
}

# --- one job ------------------------------------------------------------------------------------
# The job's one-line reason: its exit code and the last line of the error amlemu recorded (the
# exception a log tail ends with, or amlemu's notice after it), else the error's first line.
reason() {
    local steps
    steps=$(pipeline_steps "$1")
    if [[ -n "$steps" ]]; then
        local row step child status out=""
        while IFS=$'\t' read -r step child status; do
            row="$step $status"
            [[ $status == Failed* && -n "$child" && "$child" != - ]] && row="$row ($(reason "$child"))"
            out="${out:+$out; }$row"
        done <<<"$steps"
        printf 'steps: %s\n' "$out"
        return
    fi
    "$AMLEMU" job show -n "$1" -o json 2>/dev/null | python3 -c '
import json, re, sys
error = (json.load(sys.stdin).get("amlemu") or {}).get("error") or "no error recorded"
lines = [l.strip() for l in error.splitlines() if l.strip()]
code = re.match(r"the job exited with code (\d+)", lines[0])
text = (f"exit {code.group(1)}: " + lines[-1]) if code and len(lines) > 1 else lines[0]
print(text[:200])'
}

pipeline_steps() {  # a pipeline's steps (amlemu job show: amlemu.pipeline.steps): step<TAB>child<TAB>status
    "$AMLEMU" job show -n "$1" -o json 2>/dev/null | python3 -c '
import json, sys
pipeline = (json.load(sys.stdin).get("amlemu") or {}).get("pipeline") or {}
for s in pipeline.get("steps") or []:
    detail = s.get("detail") or ""
    print(s["step"], s.get("child_job") or "-", s["status"] + (" (" + detail + ")" if detail else ""), sep="\t")'
}

run_one() {  # file -> prints "outcome<TAB>seconds"
    local file=$1 log=$WORK/logs/$1.log before after name status rc start
    before=$("$AMLEMU" job list --all-results --query "[].name" -o tsv 2>/dev/null | sort)
    start=$(date +%s.%N)
    (cd "$BASICS" && timeout "$TIMEOUT" bash -x ../../run-job.sh "$file") >"$log" 2>&1
    rc=$?
    local seconds
    seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
    after=$("$AMLEMU" job list --all-results --query "[].name" -o tsv 2>/dev/null | sort)
    # the job run-job.sh created (bash -x shows its run_id), else the first new name (a
    # pipeline's step jobs are <pipeline>_<step>: they sort after it)
    name=$(grep -m1 -oE '^\+ run_id=[A-Za-z0-9_-]+$' "$log" | cut -c10-)
    [[ -n "$name" ]] || name=$(comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after") | head -n 1)
    status=""
    [[ -n "$name" ]] && status=$("$AMLEMU" job show -n "$name" --query status -o tsv 2>/dev/null)
    case "$rc:$status" in
        0:Completed) printf 'Completed\t%s\n' "$seconds" ;;
        124:*) [[ -n "$name" ]] && "$AMLEMU" job cancel -n "$name" -o none >/dev/null 2>&1
               printf 'Timeout: still %s after %s s (cancelled)\t%s\n' "${status:-unknown}" "$TIMEOUT" "$seconds" ;;
        *:Failed) printf 'Failed: %s\t%s\n' "$(reason "$name")" "$seconds" ;;
        3:*) local said  # amlemu's one line is "field: problem; fix": the problem is the reason
             said=$(grep -m1 -o 'amlemu: error: .*' "$log" | cut -c16-)
             printf 'Failed at create: %s\t%s\n' "${said%%; *}" "$seconds" ;;
        *) printf 'rc %s, status %s (see %s)\t%s\n' "$rc" "${status:-none}" "$file" "$seconds" ;;
    esac
}

kind_of() {  # a job file's type, as az ml reads it (none: command)
    local t
    t=$(grep -m1 -E '^type:' "$1" | sed -E 's/^type:[[:space:]]*//; s/[[:space:]#].*//')
    printf '%s' "${t:-command}"
}

main() {
    mkdir -p "$WORK/logs"
    echo "$("$AMLEMU" --version 2>&1 | tail -n 1); examples at $EXAMPLES ($(git -C "$EXAMPLES" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'))" >&2
    echo "setting up the workspace (home $HOME_DIR, process backend) ..." >&2
    setup >"$WORK/logs/setup.log" 2>&1 || { cat "$WORK/logs/setup.log" >&2; echo "examples_yardstick: setup failed" >&2; exit 1; }
    local rows=() skipped=() file kind result completed=0 failed=0 pipelines=0 pipelines_done=0
    while IFS= read -r path; do
        file=${path#"$BASICS"/}
        # shellcheck disable=SC2053 - ONLY is a glob
        [[ $file == $ONLY ]] || continue
        kind=$(kind_of "$path")
        case "$kind" in
            command|pipeline) ;;
            sweep) skipped+=("$file	skipped: sweep job (issue 28)"); continue ;;
            *) skipped+=("$file	skipped: $kind job (not a command job)"); continue ;;
        esac
        echo "running $file ..." >&2
        result=$(run_one "$file")
        rows+=("$file	$result")
        if [[ $kind == pipeline ]]; then
            pipelines=$((pipelines + 1))
            [[ $result == Completed* ]] && pipelines_done=$((pipelines_done + 1))
        elif [[ $result == Completed* ]]; then completed=$((completed + 1)); else failed=$((failed + 1)); fi
    done < <(find "$BASICS" -name '*.yml' -not -path '*/src/*' | sort)
    printf '\n| file | outcome | seconds |\n|---|---|---|\n'
    for row in "${rows[@]}"; do
        IFS=$'\t' read -r file result seconds <<<"$row"
        printf '| %s | %s | %s |\n' "$file" "${result//|/\\|}" "$seconds"
    done
    for row in "${skipped[@]}"; do
        IFS=$'\t' read -r file result <<<"$row"
        printf '| %s | %s | - |\n' "$file" "$result"
    done
    printf '\n%d command jobs: %d Completed, %d not; %d pipeline jobs: %d Completed, %d not; %d files skipped\n' \
        $((completed + failed)) "$completed" "$failed" "$pipelines" "$pipelines_done" \
        $((pipelines - pipelines_done)) "${#skipped[@]}"
}

main
