#!/usr/bin/env bash
# Set up everything the test suite needs, then run it: the README's test command.
#
#   bash scripts/test.sh [PYTEST ARGS...]
#
# From any folder (it works in the repository root), with the Python it finds first on PATH
# (`python`, else `python3`; set PYTHON to choose), in a virtualenv or not:
#   1. System packages the tests use: openssh-server (sshd, ssh, ssh-keygen), rsync (Ray's
#      cluster launcher copies files with it), iproute2 (ip), chromium and chromium-driver, and
#      prometheus (the dashboard's figures through a Prometheus server). Skipped when they are
#      all there already (sshd, rsync, ip, chromium, chromedriver, prometheus found).
#      Otherwise, as root, all six are installed (apt-get update once, then
#      apt-get install -y --no-install-recommends, non-interactive); not as root, the script names
#      the missing packages and how to install them, and exits 1.
#   2. PyTorch (torch==2.13.0, the CPU build) unless torch is importable, then the project,
#      editable, with its dev extras: pip install -e ".[dev]", which builds the JupyterLab
#      sidebar (labextension/: jlpm install and build, so Node 18 or later must be on PATH).
#   3. configurable-http-proxy (JupyterHub's proxy, from npm) into this environment's prefix, and the `python3`
#      Jupyter kernel: python -m ipykernel install --sys-prefix.
#   4. The tests: the layers of the kernel side (lint-imports, pyproject.toml's [tool.importlinter]); then
#      with PYTEST ARGS, python -m pytest -x -q PYTEST ARGS...; without, the sidebar's
#      unit tests (jest, in labextension/), then the whole suite as two pytest processes side
#      by side (the examples, the link-loss tests, which mostly wait out long outages, the
#      Train/Tune runs, the browser tests and the embedded cluster's kernels beside the rest).
#      Exits with the status of the first that failed; pytest's exit code 5 (no tests collected)
#      is reported as a failure.
#   The tests marked slow (a minute or more each on two cores, deeper repeats of paths the default
#   run covers; see CONTRIBUTING.md, "The tests") run only with JUPYTER_CLUSTER_SLOW_TESTS=1 (or pytest's
#   --runslow as a PYTEST ARG).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

export PIP_ROOT_USER_ACTION="${PIP_ROOT_USER_ACTION:-ignore}"
export PIP_DISABLE_PIP_VERSION_CHECK="${PIP_DISABLE_PIP_VERSION_CHECK:-1}"

# ---------------------------------------------------------------- system packages

# Whether executable NAME is here: on PATH, or in an sbin folder a non-root PATH may lack.
have() {
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]
}

packages=(openssh-server rsync iproute2 chromium chromium-driver prometheus)
missing=()
if [ ! -x /usr/sbin/sshd ] || ! have ssh || ! have ssh-keygen; then
    missing+=(openssh-server)
fi
have rsync || missing+=(rsync)
have ip || missing+=(iproute2)
have chromium || missing+=(chromium)
have chromedriver || missing+=(chromium-driver)
have prometheus || missing+=(prometheus)

if [ "${#missing[@]}" -eq 0 ]; then
    echo "::: system packages: already installed"
elif [ "$(id -u)" -eq 0 ]; then
    echo "::: system packages: ${packages[*]} (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${packages[@]}"
else
    {
        echo "scripts/test.sh: the tests need system packages that are not installed: ${missing[*]}"
        echo "Run this script as root to install them, or install them first:"
        echo "    sudo apt-get install -y --no-install-recommends ${missing[*]}"
    } >&2
    exit 1
fi

# ---------------------------------------------------------------- the project and its kernel

if ! command -v node >/dev/null 2>&1; then
    echo "scripts/test.sh: the JupyterLab sidebar is built with Node (18 or later), and there is no node on PATH" >&2
    exit 1
fi

PYTHON="${PYTHON:-$(command -v python || command -v python3 || true)}"
if [ -z "$PYTHON" ]; then
    echo "scripts/test.sh: no python or python3 on PATH" >&2
    exit 1
fi

# PyTorch for the Train examples and tests, pinned to the CPU build this registry serves
# (an unpinned torch pulls the CUDA packages, several GB); kept if one is installed.
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "::: torch (the CPU build): pip install torch==2.13.0"
    "$PYTHON" -m pip install "torch==2.13.0"
fi

echo "::: the project: pip install -e \".[dev]\" ($PYTHON)"
"$PYTHON" -m pip install -e ".[dev]"

# configurable-http-proxy, JupyterHub's proxy (npm's), into this environment: tests/test_jupyterhub.py finds it
# under sys.prefix/node_modules/.bin.
PREFIX="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
if [ ! -x "$PREFIX/node_modules/.bin/configurable-http-proxy" ]; then
    echo "::: configurable-http-proxy (npm), into $PREFIX"
    (cd "$PREFIX" && npm install --prefix "$PREFIX" --no-audit --no-fund "configurable-http-proxy@5")
fi

echo "::: the python3 kernel, into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
"$PYTHON" -m ipykernel install --sys-prefix

# ---------------------------------------------------------------- tests

# The kernel side's layers and the agent's independence (pyproject.toml's [tool.importlinter]).
echo "::: the layers: lint-imports"
"$PYTHON" -c 'import sys; from importlinter.cli import lint_imports_command; sys.argv[0] = "lint-imports"; sys.exit(lint_imports_command())'

# With no arguments, the sidebar's jest tests run first, then the whole suite as two pytest
# processes side by side, of about the same length on two cores: the example notebooks, the
# link-loss tests (which mostly wait out outages of 45 s or more), the Train/Tune runs, the
# browser tests, the runtime_env tests (whose pip installs clone the virtualenv), the chatter of Ray's libraries'
# runs (Train, Tune, Serve, RLlib), the wheel's build and install, and the tests whose
# kernels start embedded clusters of their own in one, all the others in the other. Every test that lets the head find its Ray
# (`--start-head`, `up`: a head started by this project is recorded in /tmp/jc-*, which any
# head on this machine reads) runs in the main process, one at a time: with the two-host cluster
# and the version checks beside, test_ssh's `--start-head` found their heads and attached to
# them. (A third process, for the link-loss tests alone, loaded the machine enough that an
# interrupt timed to land while a link was down landed elsewhere.)
# Each group beside the main process keeps its Ray sessions in a folder of its own
# (RAY_TMPDIR), so that no test reading /tmp/ray/session_latest meets their clusters, and the
# Ray heads they start over SSH have a --temp-dir that --start-head never looks in. With
# arguments, one pytest runs them as given.
status() {  # a pytest exit status, with "no tests collected" (5) named a failure
    if [ "$1" -eq 5 ]; then
        echo "FAILED: pytest collected no tests (exit code 5)${2:+ in $2}" >&2
    fi
}

if [ "$#" -gt 0 ]; then
    echo "::: python -m pytest -x -q $*"
    rc=0
    "$PYTHON" -m pytest -x -q "$@" || rc=$?
    status "$rc"
    exit "$rc"
fi

echo "::: the sidebar's unit tests: jlpm test (labextension/)"
# jlpm (JupyterLab's yarn) comes with the dev extras, in the environment of $PYTHON.
(cd labextension && "$PYTHON" -c 'import sys; from jupyter_builder.jlpm import main; sys.argv[0] = "jlpm"; sys.exit(main())' test)

# The groups run beside the main process, each in a pytest of its own.
BESIDE=(
    "tests/test_examples.py tests/test_link_loss.py tests/test_runs.py tests/test_browser.py tests/test_sidebar_browser.py tests/test_one_truth_browser.py tests/test_jupyterhub.py tests/test_environment.py tests/test_widgets.py tests/test_chatter.py tests/test_wheel.py"
)
ignore=()
pids=()
logs=()
tmpdirs=()
for group in "${BESIDE[@]}"; do
    read -r -a paths <<<"$group"
    for path in "${paths[@]}"; do ignore+=("--ignore=$path"); done
    log="$(mktemp)"
    tmpdir="$(mktemp -d /tmp/jcl.XXXX)"
    echo "::: python -m pytest -x -q $group (beside the rest; its output follows theirs)"
    RAY_TMPDIR="$tmpdir" "$PYTHON" -m pytest -x -q --durations=25 -p no:cacheprovider "${paths[@]}" >"$log" 2>&1 &
    pids+=($!)
    logs+=("$log")
    tmpdirs+=("$tmpdir")
done
echo "::: python -m pytest -x -q ${ignore[*]}"
rc=0
"$PYTHON" -m pytest -x -q --durations=40 "${ignore[@]}" || rc=$?
status "$rc"
for i in "${!BESIDE[@]}"; do
    rc_group=0
    wait "${pids[$i]}" || rc_group=$?
    echo "::: ${BESIDE[$i]}"
    cat "${logs[$i]}"
    rm -rf "${logs[$i]}" "${tmpdirs[$i]}"
    status "$rc_group" "${BESIDE[$i]}"
    if [ "$rc" -eq 0 ]; then
        rc=$rc_group
    fi
done
exit "$rc"
