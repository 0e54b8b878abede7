"""From evaluation to activation: skills as knowledge-base records, evaluations as signed
certificates.

A simulator skill travels as data: `publish_skill` stores its safetensors weights as a blob and puts
its architecture spec in the skill record's ``policy`` field (``{"kind": "mlp", "architecture": ...,
"weights": <blob sha256>, "skill_hash": ...}``); `load_policy` turns a record back into a checked
`sim.Policy`. A skill names the tasks it is meant for: `publish_task` stores a task definition as a
record (data, never code) and the files its scene loads as blobs, and `skill_tasks` compiles a
skill's tasks back here, fetching those files from peers as it does weights. `certify` signs an
evaluation of a knowledge-base skill as a certificate (the evaluation record rides along, so any
site can re-run it); `verify_certificate` does that re-run, `spot_check` a sampled part of it. A
site that cannot get a task's file is told so ("cannot verify here"), which is no verdict on the
certificate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import knowledge
from knowledge import Certificate, KnowledgeBase

from .._assets import declared, fetch_assets
from .._errors import (
    EntryPointError,
    EvaluationRecordError,
    MissingAssetError,
    PolicySpecError,
    TaskDefinitionError,
)
from .._mlp import POLICY_GROUP, EntryPointRef, Policy
from .._mlp_spec import MLPSpec
from .._tasks import Task
from ._evaluation_record import Evaluation, check_record
from ._probe import Probe, replay_probe
from ._reproduce import Reproduction, reproduce

# What a sampler or initial-state term randomizes, in the vocabulary of activation policies.
_KINDS = {
    ("body", "mass"): "mass",
    ("body", "inertia"): "inertia",
    ("body", "pos"): "pose",
    ("geom", "friction"): "friction",
    ("joint", "damping"): "damping",
    ("joint", "armature"): "armature",
    ("joint", "qpos"): "initial_state",
    ("joint", "qvel"): "initial_state",
    ("actuator", "gain"): "gain",
    ("actuator", "bias"): "bias",
    ("option", "gravity"): "gravity",
}


def randomized(record: Mapping[str, Any]) -> list[str]:
    """The kinds of randomization an evaluation record used: dynamics (its sampler) and initial
    state (its task)."""
    terms = list(record["sampler"].get("terms", [])) + list(
        record["task"]["definition"].get("init", [])
    )
    kinds = set()
    for term in terms:
        parts = str(term.get("target", "")).split("/")
        kind = _KINDS.get((parts[0].removesuffix("@joint"), parts[-1]))  # actuator@joint/...
        if kind is not None:
            kinds.add(kind)
    return sorted(kinds)


def publish_task(kb: KnowledgeBase, task: Task) -> str:
    """Store a task's definition in `kb` as a replicated record and the files its scene loads as
    blobs; returns its hash (`task.hash`)."""
    return kb.tasks.publish(task.definition, name=task.name, assets=task.assets)


def fetch_task(kb: KnowledgeBase, task_hash: str) -> Task:
    """The task with this hash compiled here, the files its scene loads fetched from `kb`'s blobs
    (and its blob sources: peers): UnknownTaskError if the definition has not arrived,
    MissingAssetError if no source has a file, TaskDefinitionError if it does not compile here."""
    definition = kb.tasks.get(task_hash)
    return Task(definition, fetch_assets(kb, definition))


def skill_tasks(kb: KnowledgeBase, skill_id: str) -> list[Task]:
    """The tasks a skill names, compiled here (`fetch_task`): UnknownTaskError if a definition has
    not arrived, MissingAssetError if a file its scene loads cannot be fetched, TaskDefinitionError
    if one does not compile here (a scene MuJoCo refuses, a term this version lacks, an entry point
    not installed)."""
    return [fetch_task(kb, h) for h in kb.skills.get(skill_id).tasks]


def publish_skill(
    kb: KnowledgeBase,
    skill: Policy,
    name: str,
    task: str,
    *,
    description: str = "",
    embodiments: Iterable[Mapping[str, Any]] = (),
    parents: Iterable[str] = (),
    meta: Mapping[str, Any] | None = None,
    tasks: Iterable[Task] = (),
) -> knowledge.Skill:
    """Publish a simulator skill: weights as a content-addressed blob, the architecture in the
    record, and the definitions of the `tasks` it is meant for as records the skill names (so any
    site can evaluate it, and a certificate counts only for one of them). The skill's `blobs` are
    the weights and the files its tasks' scenes load: what a robot pushes to its site with the
    skill (`federation.sync_with(..., push_blobs=skill.blobs)`) for other sites to run it."""
    weights, tasks = kb.blobs.put(skill.weights), list(tasks)
    assets = sorted({h for t in tasks for h in t.definition.get("assets", {}).values()} - {weights})
    policy = {
        "kind": "mlp",
        "architecture": skill.spec.to_json(),
        "weights": weights,
        "skill_hash": skill.hash,
    }
    return kb.skills.publish(
        name,
        task,
        description=description,
        policy=policy,
        blobs=[weights, *assets],
        embodiments=embodiments,
        parents=parents,
        meta=meta,
        tasks=[publish_task(kb, t) for t in tasks],
    )


def load_policy(kb: KnowledgeBase, skill_id: str) -> Policy | EntryPointRef:
    """The runnable policy of a knowledge-base skill: weights checked against their hash and the
    spec; or, for a skill that names a local entry point, its EntryPointRef, checked to be installed
    here at the recorded version (`evaluate` calls its factory with the task).

    Weights not stored here are fetched from the knowledge base's blob sources (`kb.blobs.fetch`:
    the `simnet` command attaches the site's peers): BlobError if none has them, BlobQuotaError if
    they do not fit in the store's quota. PolicySpecError / PolicyPayloadError if the record's
    policy is not a valid skill, EntryPointError if it names a local entry point that is not
    installed at the recorded version.
    """
    policy = kb.skills.get(skill_id).policy
    if not isinstance(policy, dict):
        raise PolicySpecError("policy", f"skill {skill_id[:16]}… carries no policy")
    if policy.get("kind") == "mlp":
        skill = Policy(
            MLPSpec.from_json(policy.get("architecture")),
            kb.blobs.fetch(str(policy.get("weights"))),
        )
        if policy.get("skill_hash") not in (None, skill.hash):
            raise PolicySpecError(
                "policy.skill_hash", "does not match the architecture and weights"
            )
        return skill
    if policy.get("kind") == "entry_point":
        # the policies' group only: a record naming another (console_scripts) would have this site
        # import and call any installed program's entry point with the task
        if policy.get("group", POLICY_GROUP) != POLICY_GROUP:
            raise PolicySpecError("policy.group", f"must be {POLICY_GROUP!r}")
        fields = {k: policy[k] for k in ("name", "distribution", "version") if k in policy}
        ref = EntryPointRef(**fields)
        ref.load()  # EntryPointError now if it is not installed here at the recorded version
        return ref
    raise PolicySpecError("policy.kind", f"{policy.get('kind')!r} is not 'mlp' or 'entry_point'")


def certify(
    kb: KnowledgeBase,
    skill_id: str,
    evaluation: Evaluation | Mapping[str, Any],
    *,
    probe: Probe | None = None,
) -> Certificate:
    """Sign an evaluation of `skill_id` as a certificate in `kb` (the writer needs the validate
    role), with the worst region an adversarial `probe` of the same skill found, if one ran.

    The evaluation must be of that skill's own policy; a failed run never reaches here (evaluate
    raises). The files its task's scene loads are stored in `kb` as blobs, so that other sites can
    fetch them to re-run it (given a record instead of an Evaluation, they must be stored already:
    MissingAssetError).
    """
    record = evaluation.to_record() if isinstance(evaluation, Evaluation) else dict(evaluation)
    check_record(record)
    if isinstance(evaluation, Evaluation):
        for data in evaluation.task.assets.values():
            kb.blobs.put(data)
    for name, digest in sorted(declared(record["task"]["definition"]).items()):
        if digest not in kb.blobs:
            raise MissingAssetError(name, digest, "not stored here: certify the evaluation itself")
    policy = kb.skills.get(skill_id).policy or {}
    expected = policy.get("skill_hash") if policy.get("kind") == "mlp" else None
    if expected is not None and record["policy"].get("skill_hash") != expected:
        raise EvaluationRecordError(
            f"the evaluation ran policy {str(record['policy'].get('skill_hash'))[:16]}…, "
            f"not skill {skill_id[:16]}…'s {expected[:16]}…"
        )
    summary = record["summary"]
    return kb.certificates.add(
        skill_id,
        branches=summary["n"],
        successes=summary["successes"],
        confidence=summary["confidence"],
        randomized=randomized(record),
        evaluation=record,
        probe=probe.to_record() if probe is not None else None,
    )


@dataclass(frozen=True)
class Verification:
    """The verdict on a certificate: `valid` if it is consistent and its evaluation re-runs to
    match. `verifiable` is False when it could not be re-run here (a file its task's scene loads is
    missing): then `valid` is False too, but nothing was found wrong with it."""

    valid: bool
    detail: str
    reproduction: Reproduction | None = None
    verifiable: bool = True

    @property
    def verdict(self) -> str:
        """ "valid", "invalid" (tampered, or does not reproduce) or "cannot verify here"."""
        return "valid" if self.valid else "invalid" if self.verifiable else "cannot verify here"


def verify_certificate(
    kb: KnowledgeBase, certificate: Certificate, *, workers: int = 1, threads: int = 0
) -> Verification:
    """Re-run a certificate's evaluation here: identical outcomes on the same platform, within the
    binomial interval elsewhere; and the measurement of its probe's worst region, if it has one.
    The files its task's scene loads are fetched from `kb`'s blobs and blob sources (peers).
    A tampered or non-reproducing certificate comes back valid=False; one whose files or weights no
    source has or the blob quota has no room for, or whose entry point is not installed here at
    its version, verifiable=False ("cannot verify here: ...")."""
    record = certificate.evaluation
    if not isinstance(record, dict):
        return Verification(False, "the certificate carries no evaluation record to re-run")
    try:
        check_record(record)
        summary = record["summary"]
        claims = {
            "branches": (certificate.branches, summary["n"]),
            "successes": (certificate.successes, summary["successes"]),
            "confidence": (certificate.confidence, summary["confidence"]),
            "randomized": (sorted(certificate.randomized), randomized(record)),
        }
        for field, (claimed, recorded) in claims.items():
            if claimed != recorded:
                return Verification(
                    False, f"the certificate says {field}={claimed!r}; its record says {recorded!r}"
                )
        try:
            assets = fetch_assets(kb, record["task"]["definition"])
        except TaskDefinitionError as exc:  # a malformed "assets" field
            raise EvaluationRecordError(f"record cannot be re-run: {exc}") from exc
        try:
            policy = load_policy(kb, certificate.skill)
        except (
            knowledge.BlobError,
            EntryPointError,
        ) as exc:  # weights no source has; code not here
            return Verification(False, f"cannot verify here: {exc}", verifiable=False)
        reproduction = reproduce(
            record, policy, assets=assets, workers=workers, threads=threads, progress=False
        )
        if reproduction.matches and certificate.probe is not None:
            replayed = replay_probe(
                certificate.probe, record, policy, assets=assets, threads=threads
            )
            if replayed is not None:
                return Verification(False, replayed, reproduction)
    except (MissingAssetError, knowledge.BlobQuotaError) as exc:  # absent, or no room to keep it
        return Verification(False, f"cannot verify here: {exc}", verifiable=False)
    except EvaluationRecordError as exc:
        return Verification(False, f"the evaluation record is inconsistent: {exc}")
    return Verification(reproduction.matches, reproduction.detail, reproduction)
