"""The calibration ledger's collections: kb.outcomes (robots report what a skill did in the field)
and kb.ledger (predictions scored against outcomes, the field test, suspension records). What they
compute is in `_field`."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ._errors import UnknownSkillError
from ._field import (
    FieldOutcomes,
    FieldTest,
    LedgerRow,
    Prediction,
    field_outcomes,
    field_test,
    ledger_row,
    prediction,
)
from ._models import Counts
from ._records import MAX_FIELD_VALUES, RecordType, Role, check_skill_id
from ._replica import Replica


class Outcomes:
    """kb.outcomes: what a skill did in the field, reported by the robot that ran it."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def record(
        self,
        skill_id: str,
        *,
        success: bool,
        embodiment: str,
        values: Mapping[str, float] | None = None,
        trials: int = 1,
    ) -> None:
        """Add `trials` runs of a skill on this body (all successes or all failures), and the
        continuous outcomes of the last one (`values`, e.g. ``{"steps": 41}``). One record per
        writer and skill holds the totals and the most recent values: batch many runs in
        `kb.batch()` and they cost one envelope. UnknownSkillError for a skill not held here (one
        that arrives from elsewhere for a skill a site lacks is kept, and never counted)."""
        replica = self._replica
        check_skill_id(skill_id)
        replica.require(Role.PUBLISH)
        if replica.views.skill(skill_id) is None:
            raise UnknownSkillError(f"no skill {skill_id!r} here to report outcomes of")
        if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
            raise ValueError(f"trials must be a positive integer, not {trials!r}")
        with replica.lock:
            current = replica.current_record(RecordType.OUTCOME, skill_id)
            if current is not None and current["embodiment"] != embodiment:
                raise ValueError(
                    f"this writer reports skill {skill_id[:12]}… for {current['embodiment']!r}: "
                    "one body per writer and skill"
                )
            rec = current or {"v": 1, "embodiment": embodiment, "trials": 0, "successes": 0}
            rec["trials"] += trials
            rec["successes"] += trials if success else 0
            kept = dict(rec.get("values", {}))
            for name, value in (values or {}).items():
                kept[name] = ([*kept.get(name, []), float(value)])[-MAX_FIELD_VALUES:]
            rec["values"] = kept
            rec["hlc"] = replica.now()
            replica.put_record(RecordType.OUTCOME, skill_id, rec)

    def get(self, skill_id: str) -> list[FieldOutcomes]:
        """Per (site, embodiment), the outcomes reported for a skill."""
        with self._replica.lock:
            return field_outcomes(self._replica.views, skill_id)

    def totals(self, skill_id: str) -> Counts:
        found = self.get(skill_id)
        trials, successes = sum(o.trials for o in found), sum(o.successes for o in found)
        return Counts(trials, successes, trials - successes)


class Ledger:
    """kb.ledger: certificates' predictions scored against field outcomes, and the field test."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def prediction(self, skill_id: str) -> Prediction | None:
        replica = self._replica
        with replica.lock:
            policy = replica.policy.activation
            counting = [s.record for s in replica.standings(skill_id) if s.counts]
            return prediction(counting, policy, skill_id)

    def field_test(self, skill_id: str) -> FieldTest | None:
        """This site's field test of a skill (None: no certificate counts, or no outcomes here)."""
        replica = self._replica
        with replica.lock:
            outcomes = field_outcomes(replica.views, skill_id)
            predicted = self.prediction(skill_id) if outcomes else None
            if predicted is None or replica.own_site is None:
                return None
            return field_test(predicted, outcomes, replica.own_site, replica.policy.activation)

    def rows(self) -> list[LedgerRow]:
        """One row per (site, embodiment, task family) with outcomes of certified skills."""
        replica = self._replica
        groups: dict[tuple[str, str, str], list[tuple[Prediction, FieldOutcomes]]] = {}
        with replica.lock:
            views = replica.views
            for skill_id in sorted(str(i) for i in views.indexes(RecordType.OUTCOME)):
                skill = views.skill(skill_id)
                predicted = self.prediction(skill_id) if skill is not None else None
                if predicted is None:
                    continue
                for found in field_outcomes(views, skill_id):
                    key = (found.site, found.embodiment, skill["task"])  # type: ignore[index]
                    groups.setdefault(key, []).append((predicted, found))
        return [ledger_row(key, pairs) for key, pairs in sorted(groups.items())]

    def publish_suspensions(self) -> list[str]:
        """Sign this site's field-test verdicts that changed: a suspension (with its evidence) for a
        skill the test suspends, a lifting for one it no longer does. The skills written."""
        replica = self._replica
        identity = replica.require(Role.VALIDATE)
        written = []
        with replica.lock:
            for skill_id in sorted(str(i) for i in replica.views.indexes(RecordType.OUTCOME)):
                test = self.field_test(skill_id)
                now = test is not None and test.suspended
                mine = replica.current_record(RecordType.SUSPEND, skill_id)
                if bool(mine and mine["suspended"]) == now or (mine is None and not now):
                    continue
                record = {
                    "v": 1,
                    "hlc": replica.now(),
                    "suspended": now,
                    "reason": test.detail if test is not None else "no field evidence now",
                    "evidence": test.to_json() if test is not None else None,
                    "by": identity.public_key_hex,
                }
                replica.put_record(RecordType.SUSPEND, skill_id, record)
                written.append(skill_id)
        return written

    def calibration_png(self, path: str | os.PathLike[str]) -> None:
        """A calibration plot: per site, each skill's field success rate against its predicted
        rate (the diagonal is perfect calibration)."""
        import numpy as np

        from .embodiment._plot import Panel, scatter_png

        panels = []
        for row in self.rows():
            diagonal = np.linspace(0, 1, 21)
            xs = [p for p, _ in row.points] + list(diagonal)
            ys = [f for _, f in row.points] + list(diagonal)
            groups = [0] * len(row.points) + [1] * len(diagonal)
            title = f"{row.task} {row.embodiment}"[:24].upper()
            panels.append(Panel(title, np.array(xs), np.array(ys), np.array(groups)))
        if not panels:
            raise ValueError("no field outcomes of certified skills to plot")
        scatter_png(path, panels, legend=["SKILL", "IDEAL"])
