"""The consortium set-up phases a policy's units of privacy declare (DESIGN §2: "a method's own set-up exchange is a
declared phase").

A unit whose release needs the banks and the aggregator together before training round 1 declares it here, as a
:class:`~fedgl_secure.method_registry.SetupPhase`; the consortium runs every phase :func:`setup_phases` names
beside the method's own (``MethodSpec.phases``), through the hooks of ``consortium/phases.py``, and never asks the
policy itself which release it is. Today one unit has one: the label unit's release with the consortium prior
(``[dp.labels] prior = "consortium-sgc"``, :mod:`~fedgl_secure.privacy.consortium_prior`), whose FedAvg rounds
come before round 1. The simulation runs the same release in-process
(:meth:`~fedgl_secure.privacy.dp_round.FederationPrivacy.private_graphs`).
"""

from __future__ import annotations

from fedgl_secure.method_registry import SetupPhase
from fedgl_secure.policy.schema import Policy
from fedgl_secure.privacy.dp_round import releases_labels_together

LABEL_PRIOR = SetupPhase(
    "label-prior",
    "the banks release their labels in stages, each later stage with the prior all of them fit in FedAvg rounds "
    "before training round 1 (dp.labels.prior = 'consortium-sgc')",
    aggregator="fedgl_secure.consortium.label_prior_rounds:LabelPriorRounds",
    bank="fedgl_secure.consortium.bank_label_prior:LabelPriorPhase",
)
"""The label unit's release with the consortium prior."""


def setup_phases(policy: Policy) -> tuple[SetupPhase, ...]:
    """The set-up phases ``policy``'s units of privacy declare, in the order they run."""
    return (LABEL_PRIOR,) if releases_labels_together(policy) else ()
