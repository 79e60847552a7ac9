"""A node process imports only what every node of its role needs: the libraries one method, one privacy mechanism
or one data source uses are imported where they are used. About 75 node processes start in ``make test`` and each
pays again for whatever it imports at start-up: with opacus, pyarrow, SQLAlchemy and scipy.optimize imported at
start-up, importing the bank node's module and making its first optimiser took 11.9 s of CPU, against 9.0 s without
them (means of 4 runs each on the shared 2-core host, load ~10)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = (
    "import json, sys, fedgl_secure.services.bank, fedgl_secure.services.aggregator_service, "
    "fedgl_secure.services.key_authority_service; print(json.dumps(sorted(sys.modules)))"
)
USED_WHERE_NEEDED = {
    "opacus": "GAP's DP-SGD (methods/gap.py) and the privacy accountants",
    "pyarrow": "a bank's own tables (data/sources/bank_graph.py)",
    "sqlalchemy": "a bank's own SQL tables (data/sources/tables.py)",
    "scipy.optimize": "Fed²GNN's matching beyond five slots (methods/fed2gnn.py)",
    "scipy.stats": "opacus' accountants",
    "ray": "the simulation's Ray executor (simulation/ray_executor.py)",
}


def loaded_by(probe: str) -> set[str]:
    return set(
        json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    )


def test_the_services_import_no_library_that_only_one_method_or_source_uses():
    loaded = loaded_by(PROBE)
    imported = {name: why for name, why in USED_WHERE_NEEDED.items() if name in loaded}
    assert imported == {}, f"imported when a node starts, though used only by: {imported}"


def test_the_key_authority_never_imports_torch():
    """It only adds and decrypts CKKS ciphertexts; torch was 3.6 s of CPU at each of its starts (the node config's
    backbone check imported it through model/declared_backbone.py)."""
    probe = (
        "import json, sys, fedgl_secure.cli, fedgl_secure.services.node, fedgl_secure.services.key_authority_service; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    assert "torch" not in loaded_by(probe)
