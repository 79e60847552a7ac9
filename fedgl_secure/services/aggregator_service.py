"""The aggregator's HTTP service: a thin shell over :class:`~fedgl_secure.consortium.coordinator.Coordinator`.

Endpoints (mTLS; the caller's role comes from its certificate):

=======  ======================================  =======  =====================================
method   path                                    roles    what
=======  ======================================  =======  =====================================
GET      /v1/health                              any      liveness and phase
GET      /v1/status                              any      rounds, participants, pooled accuracy
POST     /v1/enrol                               bank     pseudonym set and data dimensions
GET      /v1/index                               bank     M and this bank's positions in it
GET      /v1/round                               bank     the open round (and a heartbeat)
GET      /v1/models/{version}                    bank     W̄, Ȳ, Ā of a model version (npz)
GET      /v1/rounds/{round}/stages/{stage}       bank     the broadcast after a stage (the next starts from it)
PUT      /v1/rounds/{round}/uploads/{kind}       bank     one kind's ciphertext chunks + receipt
POST     /v1/reports                             bank     evaluation counts of a model version
POST     /v1/withdraw                            bank     the bank takes no further part (budget spent)
GET      /v1/exchange                            bank     Fed²GNN exchange: nonce, signed keys, boundary sizes
PUT      /v1/exchange/key                        bank     this bank's signed X25519 exchange key
PUT      /v1/exchange/boundary                   bank     this bank's boundary pseudonyms and signal width
GET      /v1/exchange/boundaries/{bank}          bank     a bank's announced boundary pseudonyms
PUT      /v1/exchange/levels/{level}/terms/{a}   bank     a passive bank's masked term for active bank a (uint64)
GET      /v1/exchange/levels/{level}/sum         bank     the masked sum of the terms for the calling bank
GET      /v1/decryptions                         bank     partial-decryption tasks for the calling bank (and a
                                                          heartbeat)
GET      /v1/decryptions/{task}/c1               bank     each receipted upload's c1 polynomials (uint64 frames)
PUT      /v1/decryptions/{task}/partial          bank     the bank's partial decryption (uint64 residues)
PUT      /v1/decryptions/{task}/refusal          bank     why the bank refuses it (its refusal code and detail)
=======  ======================================  =======  =====================================

The exchange routes relay Fed²GNN's set-up (``methods/fed2gnn_relay.py``, protocol §12) and answer 409
``no-exchange`` for every other method. A bank calls them through
:class:`~fedgl_secure.services.aggregator_client.AggregatorClient`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
from fastapi import Depends, FastAPI, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from fedgl_secure.consortium.aggregator_port import RoundResponse
from fedgl_secure.consortium.aggregator_store import AggregatorStore
from fedgl_secure.consortium.config import ConsortiumConfig, NodeConfig, NodeRole, PkiLayout
from fedgl_secure.consortium.coordinator import Coordinator
from fedgl_secure.consortium.retry import retry_until_ready
from fedgl_secure.crypto import ckks
from fedgl_secure.crypto.receipts import Receipt
from fedgl_secure.errors import ProtocolConflict
from fedgl_secure.log import configure_logging, get_logger
from fedgl_secure.policy.schema import load_policy
from fedgl_secure.services import http_conventions
from fedgl_secure.services.aggregator_messages import (
    BROADCAST_SIGNATURE_HEADER,
    ENROL_MAX_BODY_BYTES,
    MAX_CHUNKS,
    NONCE_PATTERN,
    RECEIPT_HEADER,
    TASK_ID_PATTERN,
    BoundaryRequest,
    BoundaryResponse,
    DecryptionTasks,
    DecryptionTaskView,
    EnrolRequest,
    ExchangeKey,
    ExchangeKeyRequest,
    ExchangeResponse,
    IndexResponse,
    RefusalRequest,
    ReportRequest,
    UploadResponse,
    WithdrawRequest,
    WithdrawResponse,
)
from fedgl_secure.services.key_authority_service import KeyAuthorityClient
from fedgl_secure.services.pki import load_signing_key, load_signing_public_keys
from fedgl_secure.services.runtime import serve_with_worker
from fedgl_secure.services.tls import (
    Caller,
    caller_identity,
    make_http_client,
    require_roles,
)
from fedgl_secure.wire import encodings


def create_app(
    coordinator: Coordinator, max_body_bytes: int = encodings.DEFAULT_MAX_BODY_BYTES, lifespan=None
) -> FastAPI:
    """The aggregator's FastAPI app over ``coordinator`` (``lifespan`` runs the round loop)."""
    app = FastAPI(title="fedgl-secure aggregator", version="1", lifespan=lifespan)
    http_conventions.install_error_handlers(
        app,
        coordinator.log,
        max_body_bytes,
        {
            "/v1/enrol": ENROL_MAX_BODY_BYTES,
            "/v1/exchange/*": ENROL_MAX_BODY_BYTES,  # boundary lists and terms grow with the banks
            "/v1/rounds/*": lambda: coordinator.upload_body_limit(max_body_bytes),
        },
    )
    bank_only = require_roles(NodeRole.BANK)
    chunk_limit = ckks.max_chunk_bytes(coordinator.policy.he)  # the largest ciphertext these parameters make

    @app.get("/v1/health")
    def health(caller: Caller = Depends(caller_identity)) -> dict:
        return {"role": "aggregator", "federation": coordinator.federation, "phase": coordinator.round_phase()}

    @app.get("/v1/status")
    def status(caller: Caller = Depends(caller_identity)) -> dict:
        return coordinator.status()

    @app.post("/v1/enrol", responses=http_conventions.error_responses(409))
    def enrol(request: EnrolRequest, caller: Caller = Depends(bank_only)) -> dict:
        coordinator.enrol(caller.name, request.num_features, request.num_classes, request.checked_pseudonyms())
        return {"enrolled": True}

    @app.get("/v1/index", responses=http_conventions.error_responses(409))
    def index(caller: Caller = Depends(bank_only)) -> IndexResponse:
        size, positions = coordinator.index_for(caller.name)
        return IndexResponse(
            num_global_nodes=size, positions=positions.tolist(), max_bank_nodes=coordinator.max_bank_nodes()
        )

    @app.get("/v1/decryptions")
    def decryption_tasks(caller: Caller = Depends(bank_only)) -> DecryptionTasks:
        coordinator.heartbeat(caller.name)  # the bank's decryption thread polls here while its worker trains
        return DecryptionTasks(
            tasks=[
                DecryptionTaskView(
                    task_id=task.task_id,
                    round=task.round,
                    kind=task.kind,
                    receipts=[receipt.model_dump(mode="json") for receipt in task.receipts],
                    decrypting_set=list(task.decrypting_set),
                    chunks=task.chunks,
                )
                for task in coordinator.board.pending_for(caller.name)
            ]
        )

    @app.get(
        "/v1/decryptions/{task_id}/c1",
        response_class=Response,
        responses={
            **http_conventions.binary_response(
                "each receipted upload's c1 polynomials, framed by encodings.encode_uint64_frames"
            ),
            **http_conventions.error_responses(409),
        },
    )
    def decryption_c1(
        task_id: Annotated[str, Path(pattern=TASK_ID_PATTERN)], caller: Caller = Depends(bank_only)
    ) -> Response:
        task = coordinator.board.task_for(task_id, caller.name)
        return Response(encodings.encode_uint64_frames(task.upload_c1), media_type=http_conventions.OCTET_STREAM)

    @app.put(
        "/v1/decryptions/{task_id}/partial",
        responses=http_conventions.error_responses(400, 409),
        openapi_extra=http_conventions.uint64_request(
            "the bank's partial decryption: chunks x primes x N little-endian uint64 (encodings.encode_uint64)"
        ),
    )
    async def decryption_partial(
        task_id: Annotated[str, Path(pattern=TASK_ID_PATTERN)], request: Request, caller: Caller = Depends(bank_only)
    ) -> dict:
        task = coordinator.board.task_for(task_id, caller.name)  # every 409 before the body is read
        shape = (task.chunks, *coordinator.board.level.shape)
        residues = encodings.decode_uint64(await request.body(), expected_length=int(np.prod(shape)))  # 400: size
        await run_in_threadpool(coordinator.board.accept_partial, task_id, caller.name, residues.reshape(shape))
        return {"accepted": True}

    @app.put("/v1/decryptions/{task_id}/refusal", responses=http_conventions.error_responses(409))
    def decryption_refusal(
        task_id: Annotated[str, Path(pattern=TASK_ID_PATTERN)],
        request: RefusalRequest,
        caller: Caller = Depends(bank_only),
    ) -> dict:
        coordinator.board.accept_refusal(task_id, caller.name, request.reason, request.detail)
        return {"accepted": True}

    @app.get("/v1/round", responses=http_conventions.error_responses(409))
    def current_round(caller: Caller = Depends(bank_only)) -> RoundResponse:
        return RoundResponse.model_validate(dataclasses.asdict(coordinator.round_view(caller.name)))

    @app.get(
        "/v1/models/{version}",
        response_class=Response,
        responses={
            **http_conventions.binary_response("W̄, Ȳ, Ā of the version as an .npz bundle"),
            **http_conventions.error_responses(409),
        },
    )
    def model(
        version: Annotated[int, Path(ge=0, le=http_conventions.MAX_JSON_INT)], caller: Caller = Depends(bank_only)
    ) -> Response:
        body, signature = coordinator.broadcast_for(caller.name, version)  # this bank's rows only, signed
        return Response(body, media_type=http_conventions.OCTET_STREAM, headers={BROADCAST_SIGNATURE_HEADER: signature})

    @app.get(
        "/v1/rounds/{round_number}/stages/{stage}",
        response_class=Response,
        responses={
            **http_conventions.binary_response("the broadcast after the stage, as an .npz bundle (as a model version)"),
            **http_conventions.error_responses(409),
        },
    )
    def stage_model(
        round_number: Annotated[int, Path(ge=1, le=http_conventions.MAX_JSON_INT)],
        stage: Annotated[str, Path(max_length=64)],
        caller: Caller = Depends(bank_only),
    ) -> Response:
        body, signature = coordinator.stage_broadcast_for(caller.name, round_number, stage)
        return Response(body, media_type=http_conventions.OCTET_STREAM, headers={BROADCAST_SIGNATURE_HEADER: signature})

    @app.put(
        "/v1/rounds/{round_number}/uploads/{kind}",
        responses=http_conventions.error_responses(400, 409),
        openapi_extra=http_conventions.binary_request(
            "one kind's ciphertext chunks, framed by encodings.encode_chunks",
            headers={RECEIPT_HEADER: "the signed Receipt as base64url compact JSON (encodings.encode_header)"},
        ),
    )
    async def upload(
        round_number: Annotated[int, Path(ge=1, le=http_conventions.MAX_JSON_INT)],
        kind: str,
        request: Request,
        caller: Caller = Depends(bank_only),
    ) -> UploadResponse:
        receipt = encodings.decode_header(request.headers.get(RECEIPT_HEADER), Receipt, RECEIPT_HEADER)
        body = await request.body()  # capped by the app's BodyLimitMiddleware (413)
        chunks = encodings.decode_chunks(body, max_chunks=MAX_CHUNKS, max_chunk_bytes=chunk_limit)
        if receipt.sender != caller.name:
            raise ProtocolConflict(
                "wrong-sender", f"the receipt names {receipt.sender!r}, the certificate {caller.name!r}"
            )
        # ciphertext parsing is CPU-bound: off the event loop
        new = await run_in_threadpool(coordinator.accept_upload, caller.name, round_number, kind, chunks, receipt)
        return UploadResponse(accepted=True, duplicate=not new)

    @app.post("/v1/reports", responses=http_conventions.error_responses(409))
    def report(request: ReportRequest, caller: Caller = Depends(bank_only)) -> dict:
        counts = (request.val_correct, request.val_total, request.test_correct, request.test_total)
        coordinator.accept_report(caller.name, request.version, counts, request.checked_histograms())
        return {"recorded": True}

    @app.post("/v1/withdraw", responses=http_conventions.error_responses(409))
    def withdraw(request: WithdrawRequest, caller: Caller = Depends(bank_only)) -> WithdrawResponse:
        new = coordinator.withdraw(caller.name, request.reason, request.round)
        return WithdrawResponse(withdrawn=True, duplicate=not new)

    @app.get("/v1/exchange", responses=http_conventions.error_responses(409))
    def exchange(caller: Caller = Depends(bank_only)) -> ExchangeResponse:
        view = coordinator.exchange().view()
        keys = {bank: ExchangeKey(public_key=k, signature=sig) for bank, (k, sig) in view.keys.items()}
        return ExchangeResponse(
            federation=view.federation,
            nonce=view.nonce,
            hops=view.hops,
            banks=list(view.banks),
            width=view.width,
            keys=keys,
            boundary_sizes=view.boundary_sizes,
        )

    @app.put("/v1/exchange/key", responses=http_conventions.error_responses(409))
    def exchange_key(request: ExchangeKeyRequest, caller: Caller = Depends(bank_only)) -> UploadResponse:
        relay = coordinator.exchange()
        new = relay.publish_key(caller.name, request.nonce, bytes.fromhex(request.public_key), request.signature)
        return UploadResponse(accepted=True, duplicate=not new)

    @app.put("/v1/exchange/boundary", responses=http_conventions.error_responses(409))
    def exchange_boundary(request: BoundaryRequest, caller: Caller = Depends(bank_only)) -> UploadResponse:
        relay = coordinator.exchange()
        new = relay.announce_boundary(caller.name, request.nonce, request.width, request.checked_pseudonyms())
        return UploadResponse(accepted=True, duplicate=not new)

    @app.get("/v1/exchange/boundaries/{bank}", responses=http_conventions.error_responses(409))
    def announced_boundary(
        bank: Annotated[str, Path(max_length=128)], caller: Caller = Depends(bank_only)
    ) -> BoundaryResponse:
        return BoundaryResponse(bank=bank, pseudonyms=list(coordinator.exchange().boundary(bank)))

    @app.put(
        "/v1/exchange/levels/{level}/terms/{active}",
        responses=http_conventions.error_responses(400, 409),
        openapi_extra=http_conventions.uint64_request(
            "the masked term: boundary size x width little-endian uint64 (encodings.encode_uint64)"
        ),
    )
    async def exchange_term(
        level: Annotated[int, Path(ge=1, le=http_conventions.MAX_JSON_INT)],
        active: Annotated[str, Path(max_length=128)],
        nonce: Annotated[str, Query(pattern=NONCE_PATTERN)],
        request: Request,
        caller: Caller = Depends(bank_only),
    ) -> UploadResponse:
        relay = coordinator.exchange()
        length = relay.check_term(caller.name, level, active, nonce)  # every 409 before the body is read
        masked = encodings.decode_uint64(await request.body(), expected_length=length)  # 400: wrong size
        # hashing and (for the last term) summing are CPU-bound: off the event loop
        new = await run_in_threadpool(relay.accept_term, caller.name, level, active, nonce, masked)
        return UploadResponse(accepted=True, duplicate=not new)

    @app.get(
        "/v1/exchange/levels/{level}/sum",
        response_class=Response,
        responses={
            **http_conventions.binary_response("the masked sum of every passive bank's term for the caller (uint64)"),
            **http_conventions.error_responses(409),
        },
    )
    def exchange_sum(
        level: Annotated[int, Path(ge=1, le=http_conventions.MAX_JSON_INT)], caller: Caller = Depends(bank_only)
    ) -> Response:
        total = coordinator.exchange().relayed_sum(caller.name, level)
        return Response(encodings.encode_uint64(total), media_type=http_conventions.OCTET_STREAM)

    return app


def run_aggregator(node: NodeConfig, consortium: ConsortiumConfig) -> None:
    """Serve the aggregator of ``consortium`` until stopped (SIGINT/SIGTERM); rounds run on a thread."""
    configure_logging(node.log_level, json=True)
    log = get_logger(node=node.name, role="aggregator", federation=consortium.federation)
    policy = load_policy(consortium.policy)
    layout = PkiLayout(consortium.pki_dir)
    entry = consortium.node(node.name)
    ka_entry = consortium.key_authority
    ka_http = make_http_client(layout, node.name, ka_entry.url, expect_role=NodeRole.KEY_AUTHORITY)
    key_authority = KeyAuthorityClient(ka_http)
    # the collective context exists once every bank has announced its key share (409 not-ready until then)
    public_context, fingerprint = retry_until_ready(
        key_authority.public_context, "the key ceremony", log, retry_on=(ProtocolConflict,)
    )
    bank_names = [bank.name for bank in consortium.banks]
    state_dir = node.state_dir
    store = AggregatorStore(state_dir / "aggregator.sqlite3")
    coordinator = Coordinator(
        federation=consortium.federation,
        config=consortium.experiment_config(),
        policy=policy,
        banks=bank_names,
        signing_keys=load_signing_public_keys(layout, bank_names),
        public_context=public_context,
        store=store,
        decryptor=key_authority,
        liveness_seconds=node.aggregator.liveness_seconds,
        broadcast_key=load_signing_key(layout, node.name),
    )
    log.info("aggregator.starting", url=entry.url, fingerprint=fingerprint[:12])
    try:
        serve_with_worker(
            lambda lifespan: create_app(coordinator, lifespan=lifespan), coordinator.run, entry, layout, log
        )
    finally:
        store.close()
        ka_http.close()
