"""The policy is the bottom floor (DESIGN §2): importing it loads no other layer of the package and no heavy
library, so every layer — crypto, privacy, services, the key authority — may read it."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = "import json, sys, fedgl_secure.policy.schema; print(json.dumps(sorted(sys.modules)))"
# the base floor of the import contract (pyproject.toml); the method registry is data only (names, "module:Class"
# references), which the policy reads for the node mechanisms a method carries itself
BELOW_THE_POLICY = {
    "fedgl_secure",
    "fedgl_secure.errors",
    "fedgl_secure.kinds",
    "fedgl_secure.tomlio",
    "fedgl_secure.method_registry",
}


def test_the_policy_floor_imports_nothing_above_it():
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", PROBE],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    )
    ours = {name for name in loaded if name.split(".")[0] == "fedgl_secure"}
    above = sorted(name for name in ours - BELOW_THE_POLICY if not name.startswith("fedgl_secure.policy"))
    assert above == [], f"the policy floor imports {above}"
    heavy = sorted({name.split(".")[0] for name in loaded} & {"torch", "tenseal", "opacus", "scipy", "numpy"})
    assert heavy == [], f"the policy floor imports {heavy}"
