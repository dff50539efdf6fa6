"""%cluster sync: the notebook's folder as the working directory of later cells (Ray's working_dir).
On the embedded cluster here; on a second real host in test_multihost.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

import jupyter_cluster as jc
from jupyter_cluster import _sync
from jupyter_cluster.agent.cells._objects import CellRequestError
from jupyter_cluster.agent.link._sync import safe_rel

from .conftest import remote, run

pytestmark = pytest.mark.timeout(300)


def _folder(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.csv").write_text("x,y\n1,2\n3,4\n")
    (root / "helpers.py").write_text("def double(v):\n    return 2 * v\n")
    (root / ".gitignore").write_text("secret.txt\nbuild/\n")
    (root / "secret.txt").write_text("not for the cluster")
    (root / "build").mkdir()
    (root / "build" / "big.bin").write_bytes(b"\0" * 1000)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "notes.tmp").write_text("scratch")
    return root


READ = """
import os, helpers
rows = open("data/train.csv").read().splitlines()
doubled = helpers.double(21)
cwd = os.getcwd()
listed = sorted(os.listdir("."))
"""


def test_a_synced_folder_is_the_working_directory_of_later_cells(
    shell: Any, cluster: jc.Cluster, tmp_path: Path
) -> None:
    root = _folder(tmp_path / "project")
    try:
        result = cluster.sync(root, exclude=["*.tmp"])
        assert (result.files, result.sent_files, result.removed) == (3, 3, 0), result
        assert result.working_dir.startswith("gcs://"), result.working_dir
        res = remote(shell, READ)
        assert res.success, res.error_in_exec
        assert shell.user_ns["rows"] == ["x,y", "1,2", "3,4"] and shell.user_ns["doubled"] == 42
        assert shell.user_ns["cwd"] != str(root), "a copy on the cluster, not the notebook's own folder"
        assert shell.user_ns["listed"] == [".gitignore", "data", "helpers.py"], "ignored and excluded files stay here"
        assert remote(shell, "rows = open('data/train.csv').read()", "--map i in range(2)").success
        assert shell.user_ns["rows"] == ["x,y\n1,2\n3,4\n"] * 2
        assert jc.get(jc.submit(os.path.exists, "helpers.py")) is True

        # Again, unchanged: nothing is sent. Then one file changed, one removed, one added.
        again = cluster.sync(root, exclude=["*.tmp"])
        assert (again.sent_files, again.removed) == (0, 0) and again.working_dir == result.working_dir
        (root / "data" / "train.csv").write_text("x,y\n5,6\n")
        (root / "helpers.py").unlink()
        (root / "more.txt").write_text("more")
        third = cluster.sync(root, exclude=["*.tmp"])
        assert (third.sent_files, third.removed, third.files) == (2, 1, 3), third
        res = remote(shell, "import os\nrows = open('data/train.csv').read()\nlisted = sorted(os.listdir('.'))")
        assert res.success, res.error_in_exec
        assert shell.user_ns["rows"] == "x,y\n5,6\n"
        assert shell.user_ns["listed"] == [".gitignore", "data", "more.txt"]
        assert cluster.runtime_env["working_dir"] == third.working_dir
        # The session's own environment set anew keeps the folder; unsync ends it.
        cluster.set_runtime_env({"env_vars": {"A": "1"}})
        assert cluster.runtime_env == {"env_vars": {"A": "1"}, "working_dir": third.working_dir}
    finally:
        cluster.unsync()
        cluster.set_runtime_env(None)
    assert cluster.runtime_env == {}
    res = remote(shell, "import os\nhere = os.path.exists('more.txt')")
    assert res.success and shell.user_ns["here"] is False


def test_the_magic_syncs_the_notebooks_folder_by_default(shell: Any, tmp_path: Path, capsys: Any) -> None:
    root = tmp_path / "nb"
    root.mkdir()
    (root / "input.txt").write_text("from beside the notebook")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        res = run(shell, "%cluster sync")
        assert res.success, res.error_in_exec
        assert f"synced {root} (1 files" in capsys.readouterr().out
        assert remote(shell, "text = open('input.txt').read()").success
        assert shell.user_ns["text"] == "from beside the notebook"
        assert run(shell, "%cluster sync --off").success
        assert "Later cells run in Ray's default working directory" in capsys.readouterr().out
    finally:
        os.chdir(cwd)
        jc.current().unsync()


def test_a_folder_over_the_limit_is_refused_naming_its_largest_files(shell: Any, tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    (root / "weights.bin").write_bytes(os.urandom(300 * 1024))
    (root / "small.py").write_text("x = 1\n")
    run(shell, "keep = 1")
    res = run(shell, f"%cluster sync {root} --max-size 100KiB")
    assert isinstance(res.error_in_exec, UsageError)
    message = str(res.error_in_exec)
    assert "over the 100.0 KiB a sync sends" in message or "over the 100 KiB a sync sends" in message, message
    assert "weights.bin (300" in message and "--exclude" in message
    assert run(shell, f"%cluster sync {root} --max-size 100KiB --exclude '*.bin'").success
    assert shell.user_ns["keep"] == 1


def test_bad_paths_are_refused(shell: Any, tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    res = run(shell, f"%cluster sync {tmp_path / 'file.txt'}")
    assert isinstance(res.error_in_exec, UsageError) and "is a file: a sync sends a folder" in str(res.error_in_exec)
    res = run(shell, f"%cluster sync {tmp_path / 'missing'}")
    assert isinstance(res.error_in_exec, UsageError) and "does not exist" in str(res.error_in_exec)


@pytest.mark.parametrize("rel", ["../escape", "/etc/passwd", "a/../../b", "", ".", "a\\b"])
def test_the_agent_refuses_a_path_that_leaves_the_folder(rel: str) -> None:
    with pytest.raises(CellRequestError):
        safe_rel(rel)


def test_a_piece_for_a_path_outside_the_folder_is_refused(cluster: jc.Cluster) -> None:
    with pytest.raises(jc.RequestError, match=r"no sync of this session|not a path inside"):
        cluster._call("sync_put", {"files": [("../../x", 0, b"x", True)]})


def test_large_files_go_in_pieces(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(_sync.PIECE * 2 + 10))
    (tmp_path / "empty").write_bytes(b"")
    entries = _sync.scan(tmp_path)
    batches = list(_sync._batches(entries))
    pieces = [p for b in batches for p in b]
    assert [p[3] for p in pieces if p[0] == "f.bin"] == [False, False, True]
    assert b"".join(p[2] for p in pieces if p[0] == "f.bin") == path.read_bytes()
    assert [(p[1], p[2], p[3]) for p in pieces if p[0] == "empty"] == [(0, b"", True)]
