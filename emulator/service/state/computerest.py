"""A compute's REST shapes (what azure-ai-ml PUTs and reads) <-> the emulator's ClusterSpec and
nodes: pure translation, as jobrest.py is for jobs."""
from __future__ import annotations

import os
from typing import Any

from amlemu.cluster.store import Node
from amlemu.errors import ConfigError
from amlemu.service.state import bad_request, whole_number
from amlemu.service.state import jobrest
from amlemu.specs import ClusterSpec, Priority, check_quota, max_instances_quota

NODE_STATES = {"creating": "preparing", "idle": "idle", "busy": "running", "removing": "leaving"}


def _iso_minutes(seconds: int) -> str:
    return f"PT{seconds // 60}M" if seconds % 60 == 0 else f"PT{seconds}S"


def cluster_from_rest(name: str, body: Any) -> ClusterSpec:
    """A compute PUT's body -> the ClusterSpec `amlemu compute create` makes of the same fields."""
    props = body.get("properties") if isinstance(body, dict) else None
    if not isinstance(props, dict):
        raise bad_request("properties", "properties: missing; the body is not an Azure ML compute")
    kind = str(props.get("computeType", ""))
    if kind.lower() != "amlcompute":
        raise bad_request("properties.computeType", f"properties.computeType: {kind or 'missing'} computes are "
                          "not emulated; use AmlCompute")
    inner = props.get("properties") or {}
    scale = inner.get("scaleSettings") or {} if isinstance(inner, dict) else None
    if not isinstance(inner, dict) or not isinstance(scale, dict):
        field = "properties.properties" + ("" if scale is None else ".scaleSettings")
        raise bad_request(field, f"{field}: not a JSON object; send the compute's ARM body")
    idle = scale.get("nodeIdleTimeBeforeScaleDown")
    try:
        spec = ClusterSpec(name=name, vm_size=str(inner.get("vmSize") or "Standard_D2_v2"),
                           vm_priority=Priority.parse(str(inner.get("vmPriority") or "dedicated")),
                           min_nodes=whole_number(scale.get("minNodeCount"), "scaleSettings.minNodeCount", 0),
                           max_nodes=whole_number(scale.get("maxNodeCount"), "scaleSettings.maxNodeCount", 4),
                           idle_seconds_before_scaledown=120 if idle is None else
                           jobrest.seconds(idle, "scaleSettings.nodeIdleTimeBeforeScaleDown"))
        return check_quota(spec, max_instances_quota(os.environ))  # a create and a resize alike
    except ConfigError as exc:
        raise bad_request(exc.field, str(exc)) from None


def compute_props(spec: ClusterSpec, backend: str, nodes: list[Node], location: str, creating: bool) -> dict[str, Any]:
    """The AmlCompute resource's properties, as az ml and azure-ai-ml read them."""
    counts = {state: sum(1 for n in nodes if n.state == raw) for raw, state in NODE_STATES.items()}
    return {"computeType": "AmlCompute", "computeLocation": location,
            "provisioningState": "Creating" if creating else "Succeeded", "isAttachedCompute": False,
            "disableLocalAuth": True, "description": f"amlemu cluster on the {backend} backend",
            "properties": {
                "vmSize": spec.vm_size, "osType": "Linux",
                "vmPriority": "LowPriority" if spec.vm_priority is Priority.LOW_PRIORITY else "Dedicated",
                "scaleSettings": {"minNodeCount": spec.min_nodes, "maxNodeCount": spec.max_nodes,
                                  "nodeIdleTimeBeforeScaleDown": _iso_minutes(spec.idle_seconds_before_scaledown)},
                "currentNodeCount": len(nodes), "targetNodeCount": len(nodes),
                "allocationState": "Resizing" if counts["preparing"] or counts["leaving"] else "Steady",
                "nodeStateCounts": {"idleNodeCount": counts["idle"], "runningNodeCount": counts["running"],
                                    "preparingNodeCount": counts["preparing"], "leavingNodeCount": counts["leaving"],
                                    "unusableNodeCount": 0, "preemptedNodeCount": 0}}}
