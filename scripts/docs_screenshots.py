"""Copy the browser tests' screenshots into docs/images/, where the user guide shows them.

    bash scripts/test.sh tests/test_browser.py tests/test_sidebar_browser.py --runslow
    python scripts/docs_screenshots.py

The browser tests (JupyterLab served on loopback, driven in headless Chromium) write their screenshots to
tests/artifacts/browser/; this names which of them the guide uses. Look at each before committing it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts" / "browser"
IMAGES = ROOT / "docs" / "images"

#: docs/images/NAME: the screenshot it is a copy of.
SHOTS = {
    "dashboard-in-jupyterlab.png": "page.png",  # tests/test_browser.py: a notebook with a dashboard and a --map
    "training.png": "training.png",  # the Train and Tune widgets (test_browser.py, slow tier)
    "trials.png": "trials.png",
    "sidebar.png": "sidebar.png",  # tests/test_sidebar_browser.py
    "sidebar-start.png": "sidebar-start.png",
}


def main() -> int:
    missing = [shot for shot in SHOTS.values() if not (ARTIFACTS / shot).is_file()]
    if missing:
        print(f"not in {ARTIFACTS}: {', '.join(missing)}; run the browser tests first (see this script's doc)")
        return 1
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name, shot in SHOTS.items():
        shutil.copyfile(ARTIFACTS / shot, IMAGES / name)
        print(f"docs/images/{name} <- tests/artifacts/browser/{shot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
