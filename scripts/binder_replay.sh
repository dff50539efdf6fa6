#!/usr/bin/env bash
# Replays a Binder launch without Docker: what repo2docker would build from binder/, then every example in a
# Binder-sized box.
#
#   bash scripts/binder_replay.sh            # all ten examples
#   bash scripts/binder_replay.sh -k 08      # pytest's -k, to run some
#
# 1. A fresh clone of this repository's committed HEAD and a fresh Python 3.11 virtualenv.
# 2. What repo2docker's base environment has (JupyterLab 4, ipywidgets 8), PyTorch's CPU build (its wheel
#    index, named in binder/requirements.txt, cannot be reached from a machine without it: torch==2.13.0 is
#    installed first, as scripts/test.sh does), then `pip install -r binder/requirements.txt` from the clone's root.
# 3. `jupyter labextension list` must show the sidebar, the widget manager and jupyter_bokeh enabled.
# 4. The test tools (nbclient, pytest, playwright) on top; tests/test_sidebar_browser.py: the sidebar in this
#    environment's JupyterLab, in a real browser; then tests/test_binder.py's Binder-box test of every example:
#    the kernel, the agent and the embedded Ray in a 2 GiB memory cgroup with a 64 MiB /dev/shm (needs root and
#    cgroup v1's memory controller). The peaks land in the clone's tests/artifacts/binder-peaks.json, which is
#    copied back to this checkout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3.11}"
work="$(mktemp -d "${TMPDIR:-/tmp}/jc-binder.XXXXXX")"
echo "::: replaying Binder in $work"

git clone -q "$here" "$work/repo"
"$python" -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
cd "$work/repo"

pip install -q --upgrade pip
pip install -q "torch==2.13.0"
pip install -q "jupyterlab==4.*" "ipywidgets==8.*"
grep -v -- "--extra-index-url" binder/requirements.txt > "$work/requirements.txt"
started=$(date +%s)
pip install -q -r "$work/requirements.txt"
echo "::: binder/requirements.txt installed in $(( $(date +%s) - started )) s"

extensions="$(jupyter labextension list 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g')"
echo "$extensions"
for name in jupyter-cluster-labextension @jupyter-widgets/jupyterlab-manager @bokeh/jupyter_bokeh; do
    if ! grep -E "^[[:space:]]+$name v[^ ]+ enabled +OK" <<<"$extensions" >/dev/null; then
        echo "::: the Binder image would lack the JupyterLab extension $name (or it is not enabled)" >&2
        exit 1
    fi
done
echo "::: the sidebar, the widget manager and jupyter_bokeh are enabled"

pip install -q "nbclient>=0.10" "nbformat>=5.10" "pytest>=8" "pytest-timeout>=2.3" "playwright>=1.40"
python -m ipykernel install --sys-prefix >/dev/null
# The sidebar in a real JupyterLab of this environment, driven in Debian's chromium (screenshots in tests/artifacts).
python -m pytest -q -p no:cacheprovider tests/test_sidebar_browser.py
status=0
python -m pytest -q -p no:cacheprovider --runslow --durations=0 tests/test_binder.py -k "2_gib" "$@" || status=$?
if [ -f tests/artifacts/binder-peaks.json ]; then
    mkdir -p "$here/tests/artifacts"
    python - "$here/tests/artifacts/binder-peaks.json" tests/artifacts/binder-peaks.json <<'EOF'
import json, sys
from pathlib import Path

into, new = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
peaks = json.loads(into.read_text()) if into.exists() else {}
peaks.update(new)
into.write_text(json.dumps(peaks, indent=1, sort_keys=True) + "\n")
for name, peak in sorted(peaks.items()):
    print(f"{name}: peak {peak['peak_mib']} MiB of {peak['limit_mib']} MiB")
EOF
fi
exit "$status"
