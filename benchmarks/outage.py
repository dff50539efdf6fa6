"""A long outage mid-cell: the link goes silent (or is cut) for ten minutes, then comes back.

Starts a real ``sshd`` on loopback (the test suite's helper, generated keys) behind a
proxy that can go silent (nothing forwarded, nothing closed: a laptop asleep) or be cut
(reset, and new connections refused); brings Ray up there (``up``); runs a cell that
prints a line a second for ``outage + 60`` seconds; takes the link away 10 s in, for
``--outage`` seconds; then checks that every line and the result arrived exactly once,
in order, and reports how the link fared. Not run by CI (it takes ``outage + 2`` min).

Run: ``python benchmarks/outage.py [--outage 600] [--mode freeze|cut]`` (root, ``openssh-server``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from tests.sshd import CuttableLink, SSHKeys, SSHServer, free_port  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=600.0, help="seconds the link stays down (default 600)")
    parser.add_argument("--mode", choices=("freeze", "cut"), default="freeze")
    args = parser.parse_args()

    import jupyter_cluster as jc

    work = Path(tempfile.mkdtemp(prefix="jc-outage-"))
    keys = SSHKeys.generate(work / "keys")
    server = SSHServer(keys, work / "sshd").start()
    link = CuttableLink(server.host, server.port)
    known = keys.write_known_hosts(work / "known_hosts", [(link.host, link.port)])
    lines = int(args.outage) + 70
    source = f"import time\nfor i in range({lines}):\n    print(i, flush=True)\n    time.sleep(1)\nn = {lines}"
    cluster = None
    try:
        cluster = jc.up(  # a Ray of its own, even if another runs on this machine
            f"root@{link.host}:{link.port}",
            identity=str(server.identity),
            known_hosts=str(known),
            port=free_port(),
            reconnect_for=args.outage + 120,
        )
        cell = cluster.run_cell(source)
        time.sleep(10)
        (link.freeze if args.mode == "freeze" else link.cut)()
        down = time.monotonic()
        print(f"link {args.mode} at {time.strftime('%H:%M:%S')}, for {args.outage:.0f} s", flush=True)
        while time.monotonic() - down < args.outage:
            time.sleep(30)
            state = cluster.link
            print(f"  {time.monotonic() - down:4.0f} s: {state['state']}, attempts {state.get('attempts')}", flush=True)
        (link.thaw if args.mode == "freeze" else link.restore)()
        back = time.monotonic()
        while cluster.link["state"] != "connected" and time.monotonic() - back < 120:
            time.sleep(0.1)
        reconnected = time.monotonic() - back
        result = cell.result(lines + 120)
        got = cell.stdout.split()
        exact = got == [str(i) for i in range(lines)]
        events = [data for event, data in cell._history if event == "link"]
        print(
            f"outage {args.outage:.0f} s ({args.mode}): reconnected {reconnected:.1f} s after the link came back; "
            f"{len(got)} of {lines} lines, exactly once and in order: {exact}; result n = {result.outputs['n']}; "
            f"link events: {[e['state'] for e in events]}"
        )
        return 0 if exact and result.outputs["n"] == lines else 1
    finally:
        if cluster is not None:
            cluster.down()
        link.close()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
