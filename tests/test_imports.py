"""What the production processes load: the agent and the operator run the
`shardlease` command (shardlease.cli), and none of them may load the
development tools (the demo and its `rich` grid, the benchmark, the fault
proxy, the overlap checker, the simulation, moto): each pod's sidecar pays
for every module in memory and start time."""

from __future__ import annotations

import json
import subprocess
import sys

TOOLS = ("shardlease.demo", "shardlease.demo_view", "shardlease_tools",
         "shardlease.checker", "shardlease.sim",
         "shardlease.conformance", "rich", "moto")

PROBE = """
import json, resource, sys
import shardlease.cli, shardlease.k8s.commands, shardlease.k8s.agent, shardlease.k8s.operator
tools = %r
loaded = sorted(m for m in sys.modules if any(m == t or m.startswith(t + ".") for t in tools))
print(json.dumps({"loaded": loaded, "modules": len(sys.modules),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def test_the_agent_and_the_operator_load_no_development_tool() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE % (TOOLS,)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    seen = json.loads(out)
    print(f"modules {seen['modules']}, peak RSS {seen['rss_mb']:.1f} MB")
    assert seen["loaded"] == [], seen["loaded"]
