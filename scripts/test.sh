#!/usr/bin/env bash
# Set up everything the test suite needs, then run it: the README's test command.
#
#   bash scripts/test.sh [PYTEST ARGS...]
#
# From any folder (it works in the repository root), with the Python it finds first on PATH
# (`python`, else `python3`; set PYTHON to choose), in a virtualenv or not:
#   1. System packages the tests use: openssh-server (sshd, ssh, ssh-keygen), iproute2 (ip),
#      chromium and chromium-driver. Skipped when they are all there already (sshd, ip, chromium,
#      chromedriver found). Otherwise, as root, all four are installed (apt-get update once, then
#      apt-get install -y --no-install-recommends, non-interactive); not as root, the script names
#      the missing packages and how to install them, and exits 1.
#   2. PyTorch (torch==2.13.0, the CPU build) unless torch is importable, then the project,
#      editable, with its dev extras: pip install -e ".[dev]".
#   3. The `python3` Jupyter kernel, into this environment: python -m ipykernel install --sys-prefix.
#   4. python -m pytest -x -q PYTEST ARGS...; exits with pytest's status. Exit code 5 (no tests
#      collected) is reported as a failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

export PIP_ROOT_USER_ACTION="${PIP_ROOT_USER_ACTION:-ignore}"
export PIP_DISABLE_PIP_VERSION_CHECK="${PIP_DISABLE_PIP_VERSION_CHECK:-1}"

# ---------------------------------------------------------------- system packages

# Whether executable NAME is here: on PATH, or in an sbin folder a non-root PATH may lack.
have() {
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]
}

packages=(openssh-server iproute2 chromium chromium-driver)
missing=()
if [ ! -x /usr/sbin/sshd ] || ! have ssh || ! have ssh-keygen; then
    missing+=(openssh-server)
fi
have ip || missing+=(iproute2)
have chromium || missing+=(chromium)
have chromedriver || missing+=(chromium-driver)

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

echo "::: the python3 kernel, into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
"$PYTHON" -m ipykernel install --sys-prefix

# ---------------------------------------------------------------- tests

echo "::: python -m pytest -x -q${*:+ $*}"
rc=0
"$PYTHON" -m pytest -x -q "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "FAILED: pytest collected no tests (exit code 5)" >&2
fi
exit "$rc"
