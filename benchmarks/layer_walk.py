"""The walk of the privacy policy through the package's floors (issue 28's acceptance: "a walk of the policy from
``simulate`` crosses each layer at most once per direction").

    python benchmarks/layer_walk.py --output docs/results/layer_walk_simulate.json \
        -- simulate --dataset cora --rounds 2 --secure --policy policies/strict-edge-dp.toml --no-progress

The command after ``--`` runs in this process under a profiler (``sys.setprofile``). A call *carries the policy* when
one of its arguments (``self`` included) is the loaded :class:`~fedgl_secure.policy.schema.Policy`, one of its
sections (a model defined in ``fedgl_secure/policy/``), or an object holding the policy as ``.policy`` (e.g.
``FederationPrivacy``). The walk is the tree of such calls in ``fedgl_secure``, each hanging under its nearest
carrying caller. Each call's floor is its module's layer in ``pyproject.toml``'s import contract (one source of
truth), so a step of the walk stays on its floor, goes down, or climbs back up.

The verdict, per distinct path of floors from the root (consecutive calls on one floor merged): a path that only goes
down crosses every floor at most once per direction; a climb is listed with the functions that make it. Calls made
on threads other than the main one (e.g. an encryption pool) are not traced.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import tomllib

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO / "fedgl_secure"


def contract_floors(pyproject: Path = REPO / "pyproject.toml") -> dict[str, int]:
    """Module prefix → floor number (0 is the bottom) from the import contract's ``layers``."""
    contract = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"][0]
    layers = contract["layers"]
    floors = {}
    for height, layer in enumerate(reversed(layers)):
        for module in layer.split("|"):
            floors[module.strip()] = height
    return floors


def module_of(path: str, package_dir: Path = PACKAGE_DIR) -> str | None:
    """``fedgl_secure.x.y`` for a file of the package (``package_dir``), else None."""
    file = Path(path)
    try:
        relative = file.resolve().relative_to(package_dir.resolve())
    except ValueError:
        return None
    parts = [package_dir.name, *relative.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor_of(module: str, floors: dict[str, int]) -> tuple[str, int] | None:
    """The contract's layer holding ``module`` (longest prefix) and its floor; None for the package root."""
    matches = [prefix for prefix in floors if module == prefix or module.startswith(prefix + ".")]
    if not matches:
        return None
    layer = max(matches, key=len)
    return layer, floors[layer]


@dataclass
class Walk:
    """What the profiler collects: carrying calls, their steps between floors, the distinct floor paths."""

    floors: dict[str, int]
    policy_types: tuple[type, ...]
    package_dir: Path = PACKAGE_DIR
    calls: int = 0
    steps: Counter = field(default_factory=Counter)  # (kind, caller function, callee function) → calls
    paths: set = field(default_factory=set)  # distinct floor paths, consecutive equal floors merged
    _stack: list = field(default_factory=list)  # per live frame: its floor path, or None when not carrying
    _files: dict = field(default_factory=dict)  # code filename → (layer, floor) or None

    def carries(self, frame: FrameType) -> bool:
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        values = frame.f_locals
        for name in names:
            value = values.get(name)
            if isinstance(value, self.policy_types) or isinstance(getattr(value, "policy", None), self.policy_types):
                return True
        return False

    def place(self, frame: FrameType) -> tuple[str, int] | None:
        filename = frame.f_code.co_filename
        if filename not in self._files:
            module = module_of(filename, self.package_dir)
            self._files[filename] = floor_of(module, self.floors) if module else None
        return self._files[filename]

    def profile(self, frame: FrameType, event: str, _arg: object) -> None:
        if event == "return":
            if self._stack:
                self._stack.pop()
            return
        if event != "call":
            return
        parent = next((entry for entry in reversed(self._stack) if entry is not None), None)
        placed = self.place(frame)
        if placed is None or not self.carries(frame):
            self._stack.append(None)
            return
        layer, floor = placed
        function = f"{module_of(frame.f_code.co_filename, self.package_dir)}:{frame.f_code.co_qualname}"
        self.calls += 1
        path = (layer,) if parent is None else parent[0]
        if parent is not None:
            parent_floor, parent_function = parent[1], parent[2]
            kind = "stay" if floor == parent_floor else "down" if floor < parent_floor else "climb"
            self.steps[(kind, parent_function, function)] += 1
            if path[-1] != layer:
                path = (*path, layer)
        self.paths.add(path)
        self._stack.append((path, floor, function))

    def verdict(self, command: list[str]) -> dict:
        """Steps by kind, climbs by function, and each path's entries per floor and direction."""
        kinds = Counter()
        for (kind, _caller, _callee), count in self.steps.items():
            kinds[kind] += count
        climbs = sorted(
            {f"{caller} → {callee}" for (kind, caller, callee) in self.steps if kind == "climb"},
        )
        worst = 0
        crossing_paths = []
        for path in sorted(self.paths):
            entries = Counter()
            for upper, lower in zip(path, path[1:], strict=False):
                direction = "down" if self.floors[lower] < self.floors[upper] else "up"
                entries[(lower, direction)] += 1
            worst = max(worst, max(entries.values(), default=0))
            if any(direction == "up" for (_layer, direction) in entries) or any(n > 1 for n in entries.values()):
                crossing_paths.append(" → ".join(path))
        return {
            "benchmark": "benchmarks/layer_walk.py -- " + " ".join(command),
            "carrying_calls": self.calls,
            "distinct_steps": {
                kind: sum(1 for key in self.steps if key[0] == kind) for kind in ("stay", "down", "climb")
            },
            "calls_by_step": dict(kinds),
            "climbs": climbs,
            "distinct_floor_paths": len(self.paths),
            "floor_paths": [" → ".join(path) for path in sorted(self.paths)],
            "paths_that_climb_or_reenter": crossing_paths,
            "most_entries_of_one_floor_per_direction_on_a_path": worst,
            "each_floor_crossed_at_most_once_per_direction": not crossing_paths and worst <= 1,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="fedgl-secure's arguments, after --")
    args = parser.parse_args(argv)
    command = [part for part in args.command if part != "--"] if args.command[:1] == ["--"] else args.command
    from pydantic import BaseModel

    from fedgl_secure import policy as policy_package
    from fedgl_secure.cli import app

    modules = [
        importlib.import_module(f"{policy_package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(policy_package.__path__)
    ]
    section_types = tuple(
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module.__name__
    )
    walk = Walk(contract_floors(), section_types)
    sys.setprofile(walk.profile)
    try:
        app(command, standalone_mode=False)
    finally:
        sys.setprofile(None)
    result = walk.verdict(command)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({key: result[key] for key in ("carrying_calls", "distinct_steps", "climbs")}, indent=2))
    print("each floor crossed at most once per direction:", result["each_floor_crossed_at_most_once_per_direction"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
