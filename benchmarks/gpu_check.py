# ruff: noqa: E501
"""The GPU paths, checked on a machine with an NVIDIA GPU (run there by hand; no GPU here or in CI).

1. the dashboard's figures (the metrics feed behind ``jc.dashboard``) before, during and after a GPU load
   started by a ``%%remote --gpus 1 --async`` cell, beside ``nvidia-smi``'s own readings;
2. a ``%%remote --gpus 1`` cell through a real IPython InteractiveShell;
3. ``jc.train_torch(..., num_workers=1, use_gpu=True)`` on a small model.

Run: ``OUT=/tmp/out python benchmarks/gpu_check.py`` with Ray and this package importable; it logs to stdout and
writes its samples under ``$OUT``. Figures seen: ``benchmarks/RESULTS.md`` ("GPU").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback

OUT = os.environ.get("OUT", "/tmp/out")
T0 = time.time()


def log(*args):
    print(f"[{time.time() - T0:7.1f}s]", *args, flush=True)


def smi():
    try:
        line = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        u, m, t = (float(x) for x in line.split(","))
        return {"util": u, "mem_mib": m, "total_mib": t}
    except Exception as exc:
        return {"error": repr(exc)}


log("python", sys.version.split()[0], sys.executable)
import torch  # noqa: E402

log("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
import importlib.metadata as _md  # noqa: E402  (the kernel never imports ray: it would count as a notebook module here)

log("ray (metadata)", _md.version("ray"))
import cloudpickle  # noqa: E402

log("cloudpickle", cloudpickle.__version__)
import IPython  # noqa: E402

log("ipython", IPython.__version__)

import jupyter_cluster as jc  # noqa: E402

log("jupyter_cluster", jc.__version__, jc.__file__)
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "jupyter_cluster")
ip.run_cell("import jupyter_cluster as jc", store_history=False)

if os.environ.get("JC_SKIP_STRAY") == "1":
    # Harness workaround (not the project's code): the agent's stdout carries Ray's forwarded worker
    # lines (":jc_task:" markers of wait_for_workers' tasks) before its {"ready": ...} line, and
    # EmbeddedAgent._wait_ready reads only the first line. Skip the stray lines here.
    import threading as _th

    from jupyter_cluster import _local

    def _wait_ready(self):
        stray, result = [], {}

        def read():
            for line in self.process.stdout:
                try:
                    d = json.loads(line)
                except ValueError:
                    stray.append(line)
                    continue
                if isinstance(d, dict) and "ready" in d:
                    result.update(d)
                    return
                stray.append(line)

        r = _th.Thread(target=read, daemon=True)
        r.start()
        r.join(_local.START_TIMEOUT)
        log(f"WORKAROUND: {len(stray)} stray stdout line(s) before the ready line; first: {stray[:1]!r}")
        if not result.get("ready"):
            detail = result.get("error") or self.tail_log()
            self.stop()
            raise _local.ClusterConnectionError(f"the embedded cluster did not start: {detail}")
        return result

    _local.EmbeddedAgent._wait_ready = _wait_ready

CPUS = int(os.environ.get("JC_CPUS", "4"))
t = time.time()
try:
    c = jc.local(cpus=CPUS, gpus=1)
    log(f"jc.local(cpus={CPUS}, gpus=1) up in {time.time() - t:.1f} s:", repr(c))
except Exception:
    log(f"jc.local(cpus={CPUS}, gpus=1) FAILED after {time.time() - t:.1f} s\n" + traceback.format_exc())
    t = time.time()
    c = jc.local(cpus=CPUS)
    log(f"jc.local(cpus={CPUS}) [GPU left to Ray's detection] up in {time.time() - t:.1f} s:", repr(c))
try:
    st = c.status()
    log("status:", repr(st)[:3000])
except Exception:
    log("status failed\n" + traceback.format_exc())

results: dict = {"steps": {}}

# ---------------------------------------------------------------- 2. dashboard figures
samples = []
try:
    if os.environ.get("JC_ONLY_TRAIN"):
        raise RuntimeError("skipped (JC_ONLY_TRAIN)")
    from jupyter_cluster._feed import MetricsFeed

    dash = None
    try:
        t = time.time()
        dash = jc.dashboard()
        log(f"jc.dashboard() made in {time.time() - t:.1f} s:", repr(dash))
    except Exception:
        log("jc.dashboard() failed; subscribing to the feed alone\n" + traceback.format_exc())
    feed = MetricsFeed.of(c)
    token = None if dash is not None else feed.subscribe(lambda kind, data: None)
    log("first sample:", feed.wait_first(30), "source:", feed.source)

    def take(phase):
        nodes = {}
        for node_id, node in feed.nodes.items():
            nodes[node_id[:8]] = {
                "head": node.get("head"),
                "stale": node.get("stale"),
                "cpu": node.get("cpu"),
                "gpus": {
                    k: {
                        "name": g.get("name"),
                        "util": g.get("utilization"),
                        "mem_used_mib": (g.get("memory_used") or 0) / 2**20,
                        "mem_avail_mib": (g.get("memory_available") or 0) / 2**20,
                    }
                    for k, g in node.get("gpus", {}).items()
                },
                "GPU_resource": node.get("resources", {}).get("GPU"),
            }
        bars = []
        if dash is not None:
            try:
                data = dash.bars.data
                bars = [t for (_, m), t in zip(data["y"], data["text"]) if m.startswith("GPU")]
            except Exception as exc:
                bars = [repr(exc)]
        tot = feed.totals()
        row = {
            "t": round(time.time() - T0, 1),
            "phase": phase,
            "deltas": feed.deltas,
            "nodes": nodes,
            "cluster_gpu": tot.get("gpu"),
            "bars": bars,
            "smi": smi(),
        }
        samples.append(row)
        g = next((g for n in nodes.values() for g in n["gpus"].values()), {})
        log(
            f"{phase:6s} dash: util={g.get('util')} mem_used={g.get('mem_used_mib', 0):.0f} MiB"
            f" cluster_gpu={tot.get('gpu')} | nvidia-smi: util={row['smi'].get('util')} mem={row['smi'].get('mem_mib')} MiB"
            f" | bars={bars}"
        )

    for _ in range(10):
        take("before")
        time.sleep(1)
    t_load = time.time()
    r = ip.run_cell(
        "%%remote --gpus 1 --async --out iters,seconds,tflops,peak_mib,where\n"
        "import time, os, socket\n"
        "import torch\n"
        "where = (socket.gethostname(), os.getpid(), os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
        "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
        "b = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
        "ballast = torch.ones(6 * 2**30, dtype=torch.uint8, device='cuda')  # 6 GiB held during the load\n"
        "torch.cuda.synchronize()\n"
        "iters, start = 0, time.time()\n"
        "while time.time() - start < 25:\n"
        "    cc = a @ b\n"
        "    iters += 1\n"
        "    if iters % 100 == 0:\n"
        "        torch.cuda.synchronize()\n"
        "torch.cuda.synchronize()\n"
        "seconds = time.time() - start\n"
        "tflops = 2 * 8192**3 * iters / seconds / 1e12\n"
        "peak_mib = torch.cuda.max_memory_allocated() / 2**20\n"
        "del a, b, cc, ballast\n"
        "torch.cuda.empty_cache()\n",
        store_history=True,
    )
    log(f"async cell returned in {time.time() - t_load:.2f} s, success={r.success}", r.error_in_exec or "")
    while time.time() - t_load < 34:
        take("during")
        time.sleep(1)
    out = {}
    for name in ("iters", "seconds", "tflops", "peak_mib", "where"):
        try:
            out[name] = jc.get(ip.user_ns[name], timeout=60)
        except Exception as exc:
            out[name] = repr(exc)
    log("load cell result:", out)
    for _ in range(25):
        take("after")
        time.sleep(1)
    results["steps"]["dashboard"] = {"load": out}
    try:
        snap = dash.snapshot() if dash is not None else ""
        with open(os.path.join(OUT, "dashboard_snapshot.html"), "w") as f:
            f.write(snap)
        log("dashboard snapshot (html, first 1500 chars):", snap[:1500])
    except Exception:
        log("snapshot failed\n" + traceback.format_exc())
    if dash is not None:
        dash.close()
    if token is not None:
        feed.unsubscribe(token)
except Exception:
    log("STEP dashboard FAILED\n" + traceback.format_exc())
with open(os.path.join(OUT, "samples_train_run.json" if os.environ.get("JC_ONLY_TRAIN") else "samples.json"), "w") as f:
    json.dump(samples, f, indent=1, default=repr)

# ---------------------------------------------------------------- 1. %%remote --gpus 1
try:
    if os.environ.get("JC_ONLY_TRAIN"):
        raise RuntimeError("skipped (JC_ONLY_TRAIN)")
    t = time.time()
    r = ip.run_cell(
        "%%remote --gpus 1\n"
        "import os\n"
        "import torch\n"
        "name = torch.cuda.get_device_name(0)\n"
        "visible = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
        "capability = torch.cuda.get_device_capability(0)\n"
        "x = torch.randn(4096, 4096, device='cuda')\n"
        "checksum = float((x @ x).abs().mean())\n"
        "worker_torch = torch.__version__\n"
        "print('on the worker:', name, 'CUDA_VISIBLE_DEVICES =', visible)\n"
        "name\n",
        store_history=True,
    )
    dt = time.time() - t
    ns = ip.user_ns
    got = {k: ns.get(k) for k in ("name", "visible", "capability", "checksum", "worker_torch")}
    log(f"%%remote --gpus 1 cell: success={r.success} in {dt:.2f} s; namespace: {got}")
    log("type(name) in the kernel:", type(ns.get("name")).__name__, "| result:", repr(r.result))
    # a second time: the worker is warm
    t = time.time()
    r2 = ip.run_cell("%%remote --gpus 1\nimport torch\nname2 = torch.cuda.get_device_name(0)\n", store_history=True)
    log(
        f"second %%remote --gpus 1 cell: success={r2.success} in {time.time() - t:.2f} s; name2={ip.user_ns.get('name2')!r}"
    )
    # semantics 7: a request no node can satisfy
    t = time.time()
    r3 = ip.run_cell("%%remote --gpus 2\nz = 1\n", store_history=True)
    log(
        f"%%remote --gpus 2 (cluster has 1): success={r3.success} in {time.time() - t:.2f} s; error={r3.error_in_exec!r}"
    )
    results["steps"]["remote"] = {"ok": bool(r.success), "ns": got, "seconds": dt}
except Exception:
    log("STEP remote FAILED\n" + traceback.format_exc())

# ---------------------------------------------------------------- 3. jc.train_torch on the GPU
try:
    ip.run_cell(
        "def train_fn(config):\n"
        "    import torch\n"
        "    import ray.train\n"
        "    from ray.train.torch import get_device, prepare_model\n"
        "    torch.manual_seed(0)\n"
        "    device = get_device()\n"
        "    x = torch.randn(8192, 64)\n"
        "    w = torch.randn(64, 1)\n"
        "    y = torch.tanh(x @ w) + 0.05 * torch.randn(8192, 1)\n"
        "    x, y = x.to(device), y.to(device)\n"
        "    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))\n"
        "    param_device = str(next(model.parameters()).device)\n"
        "    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else '-'\n"
        "    print(f'worker device={device} params on {param_device} gpu={name}')\n"
        "    opt = torch.optim.Adam(model.parameters(), lr=config['lr'])\n"
        "    loss_fn = torch.nn.MSELoss()\n"
        "    for epoch in range(1, config['epochs'] + 1):\n"
        "        total = 0.0\n"
        "        for i in range(0, 8192, 512):\n"
        "            loss = loss_fn(model(x[i:i + 512]), y[i:i + 512])\n"
        "            opt.zero_grad()\n"
        "            loss.backward()\n"
        "            opt.step()\n"
        "            total += loss.item() * 512\n"
        "        ray.train.report({'epoch': epoch, 'loss': total / 8192, 'on_cuda': float(device.type == 'cuda'),\n"
        "                          'params_on_cuda': float(param_device.startswith('cuda'))})\n",
        store_history=True,
    )
    t = time.time()
    r = ip.run_cell(
        "result = jc.train_torch(train_fn, num_workers=1, use_gpu=True, config={'lr': 0.003, 'epochs': 8})\nresult\n",
        store_history=True,
    )
    dt = time.time() - t
    res = ip.user_ns.get("result")
    log(f"jc.train_torch(use_gpu=True): success={r.success} in {dt:.1f} s; error={getattr(res, 'error', None)!r}")
    try:
        import pandas as pd

        with pd.option_context("display.width", 200, "display.max_columns", 20):
            log("metrics:\n" + res.metrics.to_string())
        log("final:", getattr(res, "final", None))
        log("checkpoint:", repr(getattr(res, "checkpoint", None)))
    except Exception:
        log("reading the result failed\n" + traceback.format_exc())
    results["steps"]["train"] = {"ok": bool(r.success), "seconds": dt}
except Exception:
    log("STEP train FAILED\n" + traceback.format_exc())

# ---------------------------------------------------------------- logs, then down
try:
    agent = getattr(c, "_agent", None) or getattr(c, "agent", None)
    path = getattr(agent, "log", None)
    if path and os.path.exists(path):
        subprocess.run(["cp", path, os.path.join(OUT, "agent.log")])
        log("agent log copied from", path)
    else:
        log("no agent log found on", repr(agent))
except Exception:
    log("agent log copy failed\n" + traceback.format_exc())
try:
    ip.run_line_magic("cluster", "status")
except Exception:
    log("%cluster status failed\n" + traceback.format_exc())
t = time.time()
c.down()
log(f"down in {time.time() - t:.1f} s")
log("summary:", json.dumps(results, default=repr))
