"""Command-line interface: ``fedgl-secure simulate [--secure]`` and ``fedgl-secure reproduce table2``."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from fedgl_secure.audit.command import audit as audit_command
from fedgl_secure.board.command import board as board_command
from fedgl_secure.errors import ConfigError, FedGLError
from fedgl_secure.log import configure_logging
from fedgl_secure.method_registry import method_names
from fedgl_secure.services.commands import consortium_app, node_app, predict_command
from fedgl_secure.services.commands import fail as _fail
from fedgl_secure.services.data_commands import data_app
from fedgl_secure.services.policy_commands import policy_app

app = typer.Typer(
    help="fedgl-secure: privacy-hardened federated graph learning (FedGL) between institutions.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain one-line errors that name the flag, also in logs and pipes
)
reproduce_app = typer.Typer(
    help="Reproduce the FedGL paper's experiments.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(node_app, name="node")
app.add_typer(consortium_app, name="consortium")
app.add_typer(policy_app, name="policy")
app.add_typer(data_app, name="data")
app.command("audit")(audit_command)
app.command("board")(board_command)
app.command("predict")(predict_command)


class DatasetName(str, Enum):
    synthetic = "synthetic"
    cora = "cora"
    citeseer = "citeseer"
    acm = "acm"
    wiki = "wiki"


class ExecutorName(str, Enum):
    in_process = "in-process"
    ray = "ray"


EXECUTOR_HELP = (
    "where the banks' local work runs: in-process, or ray (the banks spread over Ray actors; the sums, the server "
    "step and the global evaluation stay in this process; the run record is the same)"
)
RAY_ADDRESS_HELP = "the Ray cluster of --executor ray (default: $RAY_ADDRESS, else a local Ray started for the run)"


# the registry's names (built-in and installed plug-ins) as the choices typer shows and checks
MethodName = Enum("MethodName", {name: name for name in method_names()}, type=str)


def parse_assignments(assignments: list[str]) -> dict[str, Any]:
    """``section.field=value`` strings → a nested override dict (values parsed as JSON when possible)."""
    overrides: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {assignment!r}: expected section.field=value, e.g. self_supervision.beta=0.3")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *sections, name = key.strip().split(".")
        target = overrides
        for section in sections:
            target = target.setdefault(section, {})
        target[name] = value
    return overrides


REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POLICY = Path("policies") / "baseline.toml"


def resolve_policy_path(policy: Path | None) -> Path:
    """``--policy`` as given, else the source checkout's ``policies/baseline.toml`` when it exists."""
    if policy is not None:
        return policy
    candidate = REPO_ROOT / DEFAULT_POLICY
    if not candidate.is_file():
        raise ConfigError(
            f"--policy: no default policy at {candidate} (installed without the repository?); "
            "pass --policy path/to/policy.toml"
        )
    return candidate


def _print_version(requested: bool) -> None:
    if requested:
        from fedgl_secure import __version__

        typer.echo(f"fedgl-secure {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    log_level: Annotated[str, typer.Option(help="structlog level: debug, info, warning, error")] = "warning",
    log_json: Annotated[bool, typer.Option(help="log as JSON lines")] = False,
    version: Annotated[
        bool,
        # eager: answered before any sub-command is required or parsed
        typer.Option("--version", is_eager=True, callback=_print_version, help="print the package version and exit"),
    ] = False,
) -> None:
    configure_logging(log_level, log_json)


@app.command()
def simulate(
    dataset: Annotated[DatasetName, typer.Option(help="dataset to federate")] = DatasetName.synthetic,
    method: Annotated[MethodName, typer.Option(help="method to run")] = MethodName.fedgl,  # type: ignore[attr-defined]
    seed: Annotated[int, typer.Option(min=0, help="run seed (sampling, init, every client's stream)")] = 0,
    rounds: Annotated[int | None, typer.Option(min=1, help="maximum number of rounds (default 300)")] = None,
    data_root: Annotated[
        Path | None, typer.Option(help="directory holding <dataset>/raw/ (default: $FEDGL_DATA)")
    ] = None,
    output: Annotated[Path | None, typer.Option(help="write the run record as JSON here")] = None,
    device: Annotated[str, typer.Option(help="'auto', 'cpu' or 'cuda'")] = "auto",
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="override any option: section.field=value (repeatable)"),
    ] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar over rounds")] = True,
    secure: Annotated[
        bool, typer.Option(help="CKKS-encrypt every upload and decrypt only sums under the key authority's rules")
    ] = False,
    policy: Annotated[
        Path | None,
        typer.Option(
            help="privacy policy (default with --secure: the repository's policies/baseline.toml); without --secure "
            "only a protection = 'none' policy is accepted"
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="write the run directory for `fedgl-secure audit` here (run.json, ledgers, receipts ...)"),
    ] = None,
    consortium: Annotated[
        Path | None,
        typer.Option(
            help="simulate this consortium file's banks on their own data ([bank.data] of the node files next to "
            "it) with its [experiment]; --set and --rounds still apply, --dataset/--method/--seed/--data-root do not"
        ),
    ] = None,
    executor: Annotated[ExecutorName, typer.Option(help=EXECUTOR_HELP)] = ExecutorName.in_process,
    ray_address: Annotated[str | None, typer.Option(help=RAY_ADDRESS_HELP)] = None,
) -> None:
    """Simulate a federation of institutions in one process and report accuracy."""
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.method_registry import method_spec
    from fedgl_secure.simulation.executors import check_executor, executor_settings
    from fedgl_secure.simulation.experiment import run_experiment

    try:
        executor_choice = executor_settings(executor.value, ray_address)
        overrides = parse_assignments(set_ or [])
        values: dict[str, Any] = {
            "dataset": dataset.value,
            "method": method.value,
            "seed": seed,
            "device": device,
            "data_root": str(data_root) if data_root else None,
        }
        for key, value in overrides.items():
            values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
        clients = None
        if consortium is not None:  # the consortium's own experiment and its banks' own graphs
            from fedgl_secure.services.orchestrate import consortium_bank_graphs

            loaded, banks = consortium_bank_graphs(consortium)
            values = loaded.experiment_config().model_dump(mode="json")
            for key, value in overrides.items():
                values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
            clients = [bank.graph for bank in banks]
        if rounds is not None:
            values.setdefault("federation", {})["max_rounds"] = rounds
        config = build_config(values)
        # before the data's and the key ceremony's time is spent
        baseline = method_spec(config.method).baseline
        policy_path = resolve_policy_path(policy) if secure or policy is not None else None
        loaded_policy = _checked_policy(policy_path, secure)
        has_dp = loaded_policy is not None and loaded_policy.has_dp
        check_executor(executor_choice, baseline=baseline, privacy=has_dp)
        dataset_graph = None
        if clients is None:  # loaded here so that data.split (e.g. the paper's Table 3 random splits) applies
            from fedgl_secure.data.registry import load_dataset

            dataset_graph = load_dataset(config.dataset, config.data_root, seed=config.seed, split=config.data)
        elif config.data.split != "standard":
            raise ConfigError("data.split: a consortium's banks bring their own train/validation/test split")
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
        summation = _secure_summation(loaded_policy, config, clients) if secure else None
        try:
            privacy = _federation_privacy(loaded_policy)
            final: list = [None]  # only the last broadcast is kept (for model.npz)
            result = run_experiment(
                config,
                dataset=dataset_graph,
                progress=progress,
                summation=summation,
                observer=lambda broadcast: final.__setitem__(0, broadcast),
                privacy=privacy,
                clients=clients,
                executor=executor_choice,
            )
            if run_dir is not None:
                from fedgl_secure.wire.run_record import SecureRecord, stopped_rounds, write_run_dir

                write_run_dir(
                    run_dir,
                    result.to_dict(),
                    final_broadcast=final[0],
                    policy_path=policy_path,
                    ledgers=privacy.ledgers() if privacy is not None else None,
                    stopped_banks=stopped_rounds(privacy),
                    secure=SecureRecord.from_summation(summation) if summation is not None else None,
                )
        finally:
            if summation is not None:
                summation.close()
    except FedGLError as error:
        _fail(error)
    summary = {
        "dataset": result.dataset,
        "method": result.method,
        "seed": result.seed,
        "rounds_run": result.rounds_run,
        "best_round": result.best_round,
        "best_val_accuracy": round(result.best_val_accuracy, 4),
        "global_test_accuracy": round(result.global_test_accuracy, 4),
        "local_test_accuracy": [round(a, 4) for a in result.local_test_accuracy],
        # ROC-AUC, PR-AUC and recall at the top 1 % on the global test set, at the best round (engine/metrics.py)
        "global_test_metrics": {key: round(value, 4) for key, value in result.global_test_metrics.items()},
        "wall_seconds": round(result.wall_seconds, 2),
    }
    if result.stopped_reason is not None:
        summary["stopped_reason"] = result.stopped_reason
    if run_dir is not None:
        summary["run_dir"] = str(run_dir)
    if summation is not None:
        summary["secure"] = {
            "policy": str(policy_path),
            "fingerprint": summation.fingerprint,
            "wire_bytes": dict(summation.wire.bytes_by_kind),
            "bytes_per_value": round(summation.wire.bytes_per_value(), 2),
        }
    typer.echo(json.dumps(summary))
    if output is not None:
        output.write_text(json.dumps(result.to_dict(), indent=1))


def _checked_policy(policy_path: Path | None, secure: bool):
    """The policy of a ``simulate`` run, refused when it does not match ``--secure``."""
    if policy_path is None:
        return None
    from fedgl_secure.errors import PolicyError
    from fedgl_secure.policy.schema import load_policy

    try:
        loaded = load_policy(policy_path)
    except PolicyError as error:
        if secure:
            raise
        raise PolicyError(f"{error}\n(--policy without --secure accepts only a protection = 'none' policy)") from None
    if secure and loaded.protection == "none":
        raise ConfigError(
            f"--policy {policy_path}: protection = 'none' sends uploads in clear, which --secure would contradict; "
            "drop --secure for a plaintext experiment, or use a policy with protection = 'he'"
        )
    if not secure and loaded.protection != "none":
        raise ConfigError(
            f"--policy {policy_path}: protection = {loaded.protection!r} needs --secure (encrypted uploads); add "
            "--secure, or use a protection = 'none' policy for a plaintext experiment"
        )
    return loaded


def _federation_privacy(policy):
    """The banks' DP step for a run under ``policy`` (None without a policy)."""
    if policy is None:
        return None
    from fedgl_secure.privacy.dp_round import FederationPrivacy

    return FederationPrivacy(policy)


def _secure_summation(policy, config, clients):
    """The CKKS summation for ``simulate --secure`` under ``policy``: its key ceremony holds one bank per client."""
    from fedgl_secure.crypto.secure_summation import SecureSummation

    federation = config.federation
    banks = len(clients) if clients is not None else federation.num_clients or len(federation.proportions)
    return SecureSummation(policy, banks=banks)


@reproduce_app.command("fed2gnn")
def reproduce_fed2gnn(
    datasets: Annotated[str, typer.Option(help="comma-separated datasets")] = "cora",
    clients: Annotated[str, typer.Option(help="comma-separated numbers of Louvain clients M")] = "5,10,15",
    seeds: Annotated[int, typer.Option(min=1, help="seeds 0..N-1 per cell")] = 10,
    output_dir: Annotated[Path, typer.Option(help="where fed2gnn.md, fed2gnn.json and runs/ go")] = Path(
        "results/fed2gnn"
    ),
    data_root: Annotated[Path | None, typer.Option(help="directory holding <dataset>/raw/")] = None,
    workers: Annotated[int, typer.Option(min=1, help="parallel worker processes")] = 1,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override: section.field=value")] = None,
    backbones: Annotated[
        str, typer.Option(help="comma-separated training.backbone values (gcn, sage, dagnn): one table each")
    ] = "gcn",
) -> None:
    """Run Table 1 (GCN, GraphSAGE) / Table 2 (DAGNN) of the Fed²GNN paper (FedAvg, FedAvg-Full, Fed²GNN, Central) and
    write fed2gnn[-<backbone>].md / .json."""
    from fedgl_secure.data.registry import DATASETS
    from fedgl_secure.engine.config import BACKBONES
    from fedgl_secure.simulation.fed2gnn_reproduce import run_table1

    try:
        dataset_list = [d.strip() for d in datasets.split(",") if d.strip()]
        for name in dataset_list:
            if name not in DATASETS:
                raise ConfigError(f"--datasets: unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
        try:
            client_list = [int(m) for m in clients.split(",") if m.strip()]
        except ValueError as error:
            raise ConfigError(f"--clients: not a comma-separated list of integers: {clients!r}") from error
        if not client_list or min(client_list) < 2:
            raise ConfigError(f"--clients: every M must be at least 2, got {clients!r}")
        backbone_list = [b.strip() for b in backbones.split(",") if b.strip()]
        for name in backbone_list:
            if name not in BACKBONES:
                raise ConfigError(f"--backbones: unknown backbone {name!r}; choose from {', '.join(BACKBONES)}")
        root = str(data_root) if data_root else None
        overrides = parse_assignments(set_ or [])
        tables = run_table1(dataset_list, client_list, seeds, output_dir, root, workers, overrides, backbone_list)
    except FedGLError as error:
        _fail(error)
    for backbone in tables:
        stem = "fed2gnn" if backbone == "gcn" else f"fed2gnn-{backbone}"
        typer.echo((output_dir / f"{stem}.md").read_text())
        typer.echo(f"wrote {output_dir / f'{stem}.md'} and {output_dir / f'{stem}.json'}")


@reproduce_app.command("table2")
def reproduce_table2(
    datasets: Annotated[str, typer.Option(help="comma-separated datasets")] = "cora,citeseer,acm,wiki",
    methods: Annotated[
        str, typer.Option(help="comma-separated methods")
    ] = "centralized,federated,fedgl-no-gpg,fedgl-no-gpl,fedgl",
    seeds: Annotated[int, typer.Option(min=1, help="seeds 0..N-1 per cell")] = 5,
    output_dir: Annotated[Path, typer.Option(help="where table2.md, table2.json and runs/ go")] = Path(
        "results/table2"
    ),
    data_root: Annotated[Path | None, typer.Option(help="directory holding <dataset>/raw/")] = None,
    workers: Annotated[int, typer.Option(min=1, help="parallel worker processes")] = 1,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override: section.field=value")] = None,
    executor: Annotated[
        ExecutorName, typer.Option(help=EXECUTOR_HELP + "; the centralized and local baselines run in-process")
    ] = ExecutorName.in_process,
    ray_address: Annotated[str | None, typer.Option(help=RAY_ADDRESS_HELP)] = None,
) -> None:
    """Run Table 2 of the FedGL paper and write table2.md / table2.json (resumable)."""
    from fedgl_secure.data.registry import DATASETS, load_dataset
    from fedgl_secure.engine.config import build_config
    from fedgl_secure.simulation.executors import executor_settings
    from fedgl_secure.simulation.reproduce import run_table2

    try:
        executor_choice = executor_settings(executor.value, ray_address)
        dataset_list = [d.strip() for d in datasets.split(",") if d.strip()]
        method_list = [m.strip() for m in methods.split(",") if m.strip()]
        for name in dataset_list:
            if name not in DATASETS:
                raise ConfigError(f"--datasets: unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
        for name in method_list:
            if name not in method_names():
                raise ConfigError(f"--methods: unknown method {name!r}; choose from {', '.join(method_names())}")
        root = str(data_root) if data_root else None
        overrides = parse_assignments(set_ or [])
        for name in dataset_list:  # fail fast on bad data or a split that does not fit, before hours of runs
            split = build_config({"dataset": name, **overrides}).data
            load_dataset(name, root, seed=0, split=split)
        table = run_table2(dataset_list, method_list, seeds, output_dir, root, workers, overrides, executor_choice)
    except FedGLError as error:
        _fail(error)
    typer.echo((output_dir / "table2.md").read_text())
    typer.echo(f"wrote {output_dir / 'table2.md'} and {output_dir / 'table2.json'} ({len(table)} datasets)")


@reproduce_app.command("graphfl")
def reproduce_graphfl(
    datasets: Annotated[str, typer.Option(help="comma-separated datasets")] = "cora,citeseer",
    seeds: Annotated[int, typer.Option(min=1, help="seeds 0..N-1 per cell")] = 5,
    parts: Annotated[
        str, typer.Option(help="comma-separated: non-iid, new-label, self-training, overlap")
    ] = "non-iid,new-label,self-training",
    labels_per_class: Annotated[str, typer.Option(help="non-IID: labelled nodes per class, comma-separated")] = (
        "10,40,80"
    ),
    backbones: Annotated[str, typer.Option(help="new label domain: comma-separated gcn, sgc")] = "gcn,sgc",
    overlaps: Annotated[str, typer.Option(help="overlap part: the shared fractions γ, comma-separated")] = "0,0.1,0.3",
    non_iid_methods: Annotated[
        str, typer.Option(help="non-IID columns, comma-separated (default all, in table order)")
    ] = "local,federated,federated+st,graphfl,graphfl+st,centralized",
    output_dir: Annotated[Path, typer.Option(help="where graphfl.md, graphfl.json and runs/ go")] = Path(
        "results/graphfl"
    ),
    data_root: Annotated[Path | None, typer.Option(help="directory holding <dataset>/raw/")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override: section.field=value")] = None,
) -> None:
    """Run the GraphFL paper's experiments (non-IID, new label domain, self-training); write graphfl.md/.json
    (the overlap variant: graphfl_overlap.md/.json)."""
    from fedgl_secure.data.registry import DATASETS
    from fedgl_secure.simulation.graphfl_experiments import PARTS, non_iid_columns, run_graphfl_reproduction
    from fedgl_secure.simulation.graphfl_overlap import OVERLAP_PART, parse_overlaps, run_graphfl_overlap

    try:
        dataset_list = [d.strip() for d in datasets.split(",") if d.strip()]
        for name in dataset_list:
            if name not in DATASETS:
                raise ConfigError(f"--datasets: unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
        part_list = [p.strip() for p in parts.split(",") if p.strip()]
        for name in part_list:
            if name not in (*PARTS, OVERLAP_PART):
                raise ConfigError(f"--parts: unknown part {name!r}; choose from {', '.join((*PARTS, OVERLAP_PART))}")
        backbone_list = [b.strip() for b in backbones.split(",") if b.strip()]
        for name in backbone_list:
            if name not in ("gcn", "sgc"):
                raise ConfigError(f"--backbones: unknown backbone {name!r}; choose from gcn, sgc")
        try:
            counts = [int(n) for n in labels_per_class.split(",") if n.strip()]
        except ValueError:
            raise ConfigError(f"--labels-per-class: {labels_per_class!r} is not a list of integers") from None
        if not counts or min(counts) < 1:
            raise ConfigError("--labels-per-class: give at least one count, each >= 1")
        columns = non_iid_columns([m.strip() for m in non_iid_methods.split(",") if m.strip()])
        root = str(data_root) if data_root else None
        if OVERLAP_PART in part_list:
            run_graphfl_overlap(
                dataset_list, seeds, output_dir, root, parse_assignments(set_ or []), counts, parse_overlaps(overlaps)
            )
            typer.echo((output_dir / "graphfl_overlap.md").read_text())
            part_list = [name for name in part_list if name != OVERLAP_PART]
            if not part_list:  # graphfl.md/.json only when one of their parts runs
                return
        run_graphfl_reproduction(
            dataset_list,
            seeds,
            output_dir,
            root,
            parse_assignments(set_ or []),
            part_list,
            counts,
            backbone_list,
            non_iid_methods=columns,
        )
    except FedGLError as error:
        _fail(error)
    typer.echo((output_dir / "graphfl.md").read_text())
    typer.echo(f"wrote {output_dir / 'graphfl.md'} and {output_dir / 'graphfl.json'}")


@app.command()
def provision(
    consortium: Annotated[Path, typer.Argument(help="the consortium file, e.g. services/consortium.toml")],
    out: Annotated[Path | None, typer.Option(help="PKI directory (default: the consortium's pki_dir)")] = None,
) -> None:
    """Create the consortium CA, every node's TLS certificate and key, and the banks' signing and pseudonym keys.

    Never replaces a file: run it again after adding a node and only that node's files are created.
    """
    from fedgl_secure.consortium.config import load_consortium
    from fedgl_secure.services.pki import provision as provision_pki

    try:
        report = provision_pki(load_consortium(consortium), out)
    except FedGLError as error:
        _fail(error)
    typer.echo(report.summary())


def main() -> None:
    app(prog_name="fedgl-secure")


if __name__ == "__main__":
    sys.exit(main())
