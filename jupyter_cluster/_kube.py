"""Ray on Kubernetes: ``%cluster connect k8s:[CONTEXT/]NAMESPACE/RAYCLUSTER``.

KubeRay runs a RayCluster's head in a pod labelled ``ray.io/cluster=NAME`` and ``ray.io/node-type=head``. The
user's own ``kubectl`` (their kubeconfig, context and RBAC) finds it, and the session goes over ``kubectl exec``
into its first container, as any ``--via`` command carries one (:mod:`._via`). The agent runs there with the
container's environment, so Ray's token is where KubeRay's ``authOptions`` put it (``RAY_AUTH_TOKEN``, from its
Secret). Each way this can fail is said as such: ``kubectl`` missing, no such RayCluster, no head pod yet (with
the pod's events), ``pods/exec`` forbidden (with the Role rule to ask for), and, on a reconnect, a head pod
replaced by another (what went with the old one).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._errors import ClusterConnectionError
from ._via import ViaTarget, last_lines

#: KubeRay's labels of a RayCluster's pods.
CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
#: The Role rule a user needs to attach (the guide's RBAC section has the whole Role).
EXEC_RULE = '{apiGroups: [""], resources: ["pods/exec"], verbs: ["create", "get"]}'


class KubeError(ClusterConnectionError):
    """The head of a RayCluster cannot be reached through ``kubectl``: the message says why and what to do."""


@dataclass
class KubeSpec:
    """``k8s:[CONTEXT/]NAMESPACE/RAYCLUSTER``."""

    namespace: str
    name: str
    context: str | None = None

    @classmethod
    def parse(cls, spec: str) -> KubeSpec:
        """
        >>> KubeSpec.parse("k8s:ray/raycluster-kuberay")
        KubeSpec(namespace='ray', name='raycluster-kuberay', context=None)
        >>> KubeSpec.parse("k8s:prod/ray/big").context
        'prod'
        """
        parts = spec.removeprefix("k8s:").split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(
                f"{spec!r}: give k8s:NAMESPACE/RAYCLUSTER, or k8s:CONTEXT/NAMESPACE/RAYCLUSTER for another kubeconfig "
                "context (`kubectl get rayclusters -A` lists them)"
            )
        return cls(parts[-2], parts[-1], parts[0] if len(parts) == 3 else None)

    def kubectl(self, *words: str) -> list[str]:
        return ["kubectl", *(["--context", self.context] if self.context else []), "-n", self.namespace, *words]

    def describe(self) -> str:
        return f"k8s:{self.context + '/' if self.context else ''}{self.namespace}/{self.name}"


async def _kubectl(spec: KubeSpec, *words: str, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run ``kubectl`` (with the spec's context and namespace): its exit status, stdout and stderr."""
    argv = spec.kubectl(*words)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError:
        raise KubeError(
            "k8s: needs `kubectl` on this machine's PATH, with a kubeconfig for the cluster "
            "(install it: https://kubernetes.io/docs/tasks/tools/)"
        ) from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        raise KubeError(f"`{' '.join(argv)}` did not answer within {timeout:.0f} s") from None
    return int(proc.returncode or 0), out.decode(errors="replace"), err.decode(errors="replace")


def _pending(pod: dict[str, Any]) -> str:
    """Why a pod is not running yet, from its status (the events say more)."""
    status = pod.get("status", {})
    waiting = [
        f"{c.get('name')}: {c['state']['waiting'].get('reason', '')} {c['state']['waiting'].get('message', '')}".strip()
        for c in status.get("containerStatuses", []) or []
        if (c.get("state") or {}).get("waiting")
    ]
    return "; ".join(waiting) or str(status.get("phase", "unknown"))


async def find_head(spec: KubeSpec) -> dict[str, Any]:
    """The RayCluster's head pod, running; a :class:`KubeError` that says why not."""
    selector = f"{CLUSTER_LABEL}={spec.name},{NODE_TYPE_LABEL}=head"
    code, out, err = await _kubectl(spec, "get", "pods", "-l", selector, "-o", "json")
    if code != 0:
        raise KubeError(f"`kubectl get pods -n {spec.namespace}` failed:\n{last_lines(err)}")
    pods = json.loads(out).get("items", [])
    if not pods:
        code, _, err = await _kubectl(spec, "get", "rayclusters.ray.io", spec.name, "-o", "json")
        if code != 0 and "NotFound" in err:
            raise KubeError(
                f"there is no RayCluster {spec.name!r} in namespace {spec.namespace!r} "
                f"(`kubectl get rayclusters -n {spec.namespace}` lists them)"
            )
        if code != 0:
            raise KubeError(f"`kubectl get raycluster {spec.name}` failed:\n{last_lines(err)}")
        raise KubeError(
            f"RayCluster {spec.name!r} has no head pod yet (KubeRay makes it: "
            f"`kubectl describe raycluster {spec.name} -n {spec.namespace}` says why not)"
        )
    running = [
        p for p in pods if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    if running:
        return dict(running[0])
    pod = pods[0]
    name = pod["metadata"]["name"]
    _, out, _ = await _kubectl(spec, "get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
    try:
        events = [f"{e.get('reason', '')}: {e.get('message', '')}" for e in json.loads(out).get("items", [])]
    except ValueError:
        events = []
    said = "\n".join(f"  {line}" for line in events[-5:])
    raise KubeError(
        f"the head pod {name} of RayCluster {spec.name!r} is not running yet ({_pending(pod)})"
        + (f"; its events:\n{said}" if said else "")
        + "\nTry again once it runs (`kubectl get pods -n "
        + spec.namespace
        + " -w`)."
    )


def exec_target(spec: KubeSpec, pod: dict[str, Any], python: str | None) -> ViaTarget:
    """``kubectl exec`` into the head pod's first container (KubeRay's ``ray-head``)."""
    container = pod["spec"]["containers"][0]["name"]
    argv = spec.kubectl("exec", "-i", pod["metadata"]["name"], "-c", container, "--")
    return ViaTarget(argv, python or "python3", explain=forbidden_hint(spec), given=spec.describe())


def forbidden_hint(spec: KubeSpec) -> dict[str, str]:
    """What to say after an error of ``kubectl exec``: the Role rule, for a refusal of ``pods/exec``."""
    return {
        "pods/exec": (
            f"Your Kubernetes user may not exec into pods in namespace {spec.namespace!r}: ask its admin for a Role "
            f'with the rule {EXEC_RULE} (the guide\'s "Ray on Kubernetes" has the whole Role).'
        )
    }


def is_kube(target: str | None) -> bool:
    """Whether ``target`` names a RayCluster (``k8s:...``) rather than an SSH head."""
    return bool(target) and str(target).startswith("k8s:")


def replacement_check(spec: KubeSpec, pod: dict[str, Any]) -> Callable[[], Awaitable[str | None]]:
    """What a link asks when ``kubectl exec`` into ``pod`` fails on a reconnect: whether the head pod is gone
    for good (KubeRay replaced it: another name, another address), and what went with it. None while the old pod
    is still there (an outage of the API server, say), or while the API server does not answer."""
    name = pod["metadata"]["name"]
    selector = f"{CLUSTER_LABEL}={spec.name},{NODE_TYPE_LABEL}=head"

    async def replaced() -> str | None:
        try:
            code, out, _ = await _kubectl(spec, "get", "pods", "-l", selector, "-o", "json", timeout=30)
            names = [p["metadata"]["name"] for p in json.loads(out).get("items", [])] if code == 0 else None
        except (KubeError, ValueError):
            return None
        if names is None or name in names:
            return None
        now = f"by {', '.join(names)}" if names else "and no head pod runs now"
        return (
            f"the head pod {name} of RayCluster {spec.name!r} was replaced {now}, and its Ray and this session's "
            "agent with it"
        )

    return replaced


__all__ = ["KubeError", "KubeSpec", "exec_target", "find_head", "is_kube", "replacement_check"]
