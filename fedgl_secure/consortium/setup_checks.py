"""What the aggregator refuses before any key is used: a consortium set-up whose every round would fail."""

from __future__ import annotations

from fedgl_secure.consortium.config import BANK_SOURCES
from fedgl_secure.consortium.participant_choice import quorum
from fedgl_secure.data.sampling import select_participants
from fedgl_secure.engine.config import ExperimentConfig
from fedgl_secure.engine.self_training import check_services as check_self_training_services
from fedgl_secure.errors import ConfigError
from fedgl_secure.methods import build_method
from fedgl_secure.methods.base import check_stage_kinds
from fedgl_secure.methods.fed2gnn import check_services
from fedgl_secure.methods.privacy_checks import check_consortium
from fedgl_secure.policy.schema import Policy


def check_consortium_can_run(config: ExperimentConfig, policy: Policy, num_banks: int) -> None:
    """Refuse, before any key is used, a set-up whose every round would fail.

    The method must upload only kinds the policy lets leave a bank (the key authority would
    refuse to decrypt the others), and a round's share of banks must reach the quorum. The
    policy's DP must be one the consortium can enforce: what the simulation refuses (e.g. the pseudo
    graph under DP on predictions/embeddings) and plain-text protection are refused by
    :func:`~fedgl_secure.methods.privacy_checks.check_consortium`, the check every bank also runs (central
    noise is run: the key authority adds it).
    """
    check_services(config, bank_sources=config.dataset == BANK_SOURCES)  # what of Fed²GNN the services run
    check_self_training_services(config)
    check_consortium(policy, config)  # a method of several stages under DP is refused here (check_stages)
    method = build_method(config)
    check_stage_kinds(method)
    kinds = method.upload_kinds
    refused = [kind for kind in kinds if kind not in policy.allowed_kinds]
    if refused:
        raise ConfigError(
            f"the experiment's method {config.method!r} uploads {list(kinds)}, but the policy's allowed_kinds "
            f"{list(policy.allowed_kinds)} keep {refused} inside the banks; allow them or choose another method"
        )
    if policy.protection == "he" and policy.he.threshold > num_banks:
        raise ConfigError(
            f"he.threshold t = {policy.he.threshold} exceeds the consortium's {num_banks} banks: no sum could ever be "
            "decrypted (t banks and the key authority decrypt together); lower he.threshold"
        )
    # the count of participants is the same every round; only which banks changes
    per_round = len(select_participants(num_banks, config.federation.participation, config.seed, 1))
    if per_round < quorum(policy):
        raise ConfigError(
            f"participation {config.federation.participation} of {num_banks} banks gives {per_round} per round, "
            f"below the policy's quorum {quorum(policy)}: no round could ever be decrypted"
        )
