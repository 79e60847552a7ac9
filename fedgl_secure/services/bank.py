"""A bank node: the bank's round client (:class:`~fedgl_secure.consortium.bank_worker.BankWorker`) wired to the
aggregator and the key authority over mutual TLS, beside its partial-decryption thread, with its own small API.

At its start the node reads its graph (its own tables, or its benchmark slice, or its Fed²GNN set-up:
``consortium/bank_data.py``), runs the key ceremony or unseals its share (``services/bank_keys.py``), then trains
beside the thread that answers the aggregator's decryption tasks; it serves health and progress meanwhile.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from fastapi import Depends, FastAPI

from fedgl_secure.consortium.bank_data import bank_graph, bank_index, fed2gnn_setup
from fedgl_secure.consortium.bank_worker import BankWorker
from fedgl_secure.consortium.config import ConsortiumConfig, NodeConfig, NodeRole, PkiLayout
from fedgl_secure.consortium.pseudonyms import pseudonymise
from fedgl_secure.crypto import threshold
from fedgl_secure.crypto.ceremony_messages import Roster
from fedgl_secure.crypto.partial_decryption import BankDecryptor
from fedgl_secure.data.sources.bank_data import BankData
from fedgl_secure.log import configure_logging, get_logger
from fedgl_secure.method_registry import NEIGHBOUR_EXCHANGE, method_spec
from fedgl_secure.methods.fed2gnn_relay import BankIdentity
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.services import http_conventions
from fedgl_secure.services.aggregator_client import AggregatorClient
from fedgl_secure.services.bank_keys import PartialDecryptionWorker, ensure_key_share
from fedgl_secure.services.key_authority_service import KeyAuthorityClient, read_operator_secret
from fedgl_secure.services.pki import load_pseudonym_key, load_signing_key, load_signing_public_keys
from fedgl_secure.services.runtime import serve_with_worker
from fedgl_secure.services.tls import Caller, caller_identity, make_http_client


@dataclass
class _Progress:
    """What the bank's health endpoint reports: its worker once the key ceremony has given it a context."""

    name: str
    worker: BankWorker | None = None


def create_app(progress: _Progress, lifespan=None) -> FastAPI:
    """The bank's own small API: health and progress (any consortium member)."""
    app = FastAPI(title=f"fedgl-secure bank {progress.name}", version="1", lifespan=lifespan)
    http_conventions.install_error_handlers(app)

    @app.get("/v1/health")
    def health(caller: Caller = Depends(caller_identity)) -> dict:
        worker = progress.worker
        return {
            "role": "bank",
            "name": progress.name,
            "phase": "key-ceremony" if worker is None else "federation",
            "rounds_done": 0 if worker is None else len(worker.rounds_done),
            "finished": worker is not None and worker.finished.is_set(),
        }

    return app


def _exchange_identity(node: NodeConfig, consortium: ConsortiumConfig, layout: PkiLayout) -> BankIdentity:
    """Who this bank is in Fed²GNN's exchange: its signing key, every bank's verification key, its pseudonyms."""
    pseudonym_key = load_pseudonym_key(layout, node.name)
    return BankIdentity(
        node.name,
        consortium.federation,
        load_signing_key(layout, node.name),
        load_signing_public_keys(layout, [bank.name for bank in consortium.banks]),
        lambda ids: pseudonymise(pseudonym_key, ids),
    )


def run_bank(node: NodeConfig, consortium: ConsortiumConfig) -> None:
    """Serve a bank until the federation finishes or the process is stopped."""
    configure_logging(node.log_level, json=True)
    log = get_logger(node=node.name, role="bank", federation=consortium.federation)
    config = consortium.experiment_config()
    policy = load_policy(consortium.policy)
    layout = PkiLayout(consortium.pki_dir)
    entry = consortium.node(node.name)
    client_index = bank_index(node, consortium)
    phase_inputs = {}  # what the bank's side of a declared set-up phase needs from this node's files
    if NEIGHBOUR_EXCHANGE in method_spec(config.method).phases:  # a set-up exchange before enrolment
        setup = fed2gnn_setup(node, consortium)
        local = setup.local_graph()
        data = BankData(local, local.node_ids.astype(str), None)
        phase_inputs[NEIGHBOUR_EXCHANGE.name] = (setup, _exchange_identity(node, consortium, layout))
    else:
        data = bank_graph(node, consortium)  # a bank whose tables do not match the schema stops here, naming the column
    config.evaluation.check_classes(data.graph.num_classes)
    if data.summary is not None:
        log.info("bank.data_loaded", **data.summary.to_dict())
    ka_http = make_http_client(layout, node.name, consortium.key_authority.url, expect_role=NodeRole.KEY_AUTHORITY)
    agg_http = make_http_client(layout, node.name, consortium.aggregator.url, expect_role=NodeRole.AGGREGATOR)
    banks = [bank.name for bank in consortium.banks]
    verify_keys = load_signing_public_keys(layout, banks)
    aggregator_key = load_signing_public_keys(layout, [consortium.aggregator.name])[consortium.aggregator.name]
    roster = Roster(consortium.federation, tuple(banks), policy.he.threshold, policy.digest)
    operator_secret = read_operator_secret(node)  # a missing secret stops the node here, naming both options
    aggregator = AggregatorClient(agg_http)
    progress = _Progress(node.name)

    def work(stop: threading.Event) -> None:
        """The key ceremony (first start) or the sealed share, then training beside partial decryption."""
        held = ensure_key_share(
            node.state_dir,
            roster,
            node.name,
            policy.he,
            operator_secret,
            KeyAuthorityClient(ka_http),
            load_signing_key(layout, node.name),
            verify_keys,
            log,
            stop=stop,
        )
        decryptor = BankDecryptor(node.state_dir, policy, threshold.rings_for(policy.he), held, verify_keys)
        decrypting = threading.Event()
        decryption = threading.Thread(
            target=PartialDecryptionWorker(aggregator, decryptor, node.bank.poll_seconds, log).run,
            args=(decrypting,),
            name=f"{node.name}-decryption",
            daemon=True,
        )
        worker = BankWorker(
            name=node.name,
            federation=consortium.federation,
            client_index=client_index,
            config=config,
            graph=data.graph,
            aggregator=aggregator,
            public_context=held.public_context,
            policy=policy,
            signing_key=load_signing_key(layout, node.name),
            pseudonym_key=load_pseudonym_key(layout, node.name),
            broadcast_key=aggregator_key,
            poll_seconds=node.bank.poll_seconds,
            state_dir=node.state_dir,
            phase_inputs=phase_inputs,
        )
        progress.worker = worker
        decryption.start()
        try:
            worker.run(stop)
        finally:
            decrypting.set()
            decryption.join(timeout=30.0)
            worker.close()
            decryptor.close()

    try:
        serve_with_worker(
            lambda lifespan: create_app(progress, lifespan=lifespan),
            work,
            entry,
            layout,
            log,
            stop_serving_when_done=True,  # the federation is over (or the worker failed)
        )
    finally:
        ka_http.close()
        agg_http.close()
