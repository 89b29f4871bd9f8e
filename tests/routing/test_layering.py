"""routing/ and sim/ must not import torch (DESIGN.md: the scheduler and simulator are plain)."""

import subprocess
import sys

MODULES = ["rcllm.routing", "rcllm.routing.validate", "rcllm.routing.vidur_fit",
           "rcllm.routing.fit", "rcllm.sim", "rcllm.sim.engine", "rcllm.sim.experiments",
           "rcllm.bench.sim", "rcllm.commands.sim", "rcllm.sim.placement", "rcllm.sim.traces",
           "rcllm.sim.plots"]


def test_routing_and_sim_import_no_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            + "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "", f"torch imported: {out.stdout.strip()[:200]}"
