"""The validator service: a site that holds the validate role certifies and spot-checks on its own.

Its queue is derived from the knowledge base, never kept beside it: a skill is queued while it is
neither active here, revoked nor withdrawn, names task definitions, this validator has not certified
it and no certificate of it awaits a spot check here; a certificate is queued while this site's
policy wants it spot-checked first (`kb.certificates.awaiting_check`). So a validator that dies mid-
evaluation loses nothing: on restart the same job is at the head of the queue again. What the
knowledge base cannot say is kept in the state file (``validator.json`` in the site's home), which
`simnet status` and the server's status page and /metrics read: progress, throughput, and jobs that
failed or wait for something (weights or a task's scene file no peer has yet, a task definition
not arrived) with the reason, so nothing is retried in a tight loop. Order: skills requested by an
operator (`simnet validate --request`), then spot checks (cheap, and they gate skills already
certified), then skills by how often this site's own robots used them (what its devices ask for);
within each, writers take turns, each with its oldest job first. A job whose task asks more physics
steps per branch than `max_branch_steps` is refused unstarted, with the reason; an evaluation that
runs longer than `max_job_s` is stopped at its next control step and fails the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import knowledge
from knowledge import BlobError, KnowledgeBase, SiteHome, UnknownTaskError

from .._assets import fetch_assets
from .._errors import SimError, TaskDefinitionError
from .._tasks import Task, definition_steps
from ..evaluation import certify, evaluate, load_policy, probe, spot_check
from ..evaluation._evaluate import DEFAULT_WAVE
from ._jobs import Job, Ranked, Trouble, taking_turns
from ._policy_budget import PolicyOverBudget, check_policy_cost
from ._scene_budget import SceneOverBudget, check_scene, rerun_wave
from ._settings import SETTINGS_FILE, ValidatorSettings

log = logging.getLogger("sim.validation")
STATE_FILE = "validator.json"
REQUESTS_FILE = "validator.requests"
HEARTBEAT_S = 60.0  # an idle validator rewrites its state this often, so readers see it alive
# may resolve by itself: weights, a task or a file its scene loads (MissingAssetError, a BlobError)
# arrive later
_WAITING = (BlobError, UnknownTaskError)
_REMEDY = (
    f"branches in {SETTINGS_FILE}, or {DEFAULT_WAVE} if more: to spot-check it, raise branches, "
    "restart and request the skill"
)


class _Stopped(Exception):
    """The service was asked to stop in the middle of an evaluation."""


class _OverBudget(Exception):
    """A job's task asks more physics steps per branch, or its run more time, than this site
    allows: not retried (the same settings give the same answer)."""


class Validator:
    """Certify and spot-check from the simulator, one job at a time (`step`, or `run` until a stop
    event), writing its state to `state_path` after every change."""

    def __init__(
        self,
        kb: KnowledgeBase,
        settings: ValidatorSettings | None = None,
        *,
        home: Path | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if kb.identity is None:
            raise knowledge.NotAuthorizedError("a validator signs: open the store with its key")
        self.kb = kb
        self.settings = settings or ValidatorSettings()
        self.home = home
        self.rng = rng or random.SystemRandom()
        self.troubles: dict[str, Trouble] = {}
        self.requested: set[str] = set()  # skills an operator asked for first
        self.served: Counter[str] = Counter()  # jobs run per writer since the start: turns
        self._stop = threading.Event()  # set by `run`'s caller
        self._deadline = float("inf")  # time.monotonic() by which the job under way must end
        self._last: dict[str, Any] | None = None  # the state written last
        self.current: dict[str, Any] | None = None
        self.totals = {
            "certificates": 0,
            "spot_checks": 0,
            "disputes": 0,
            "branches_evaluated": 0,
            "branches_spot_checked": 0,
            "busy_s": 0.0,
        }
        self._restore()

    # --- the queue --------------------------------------------------------------------------------
    def queue(self) -> list[Job]:
        kb, now = self.kb, time.time()
        own = kb.identity.public_key_hex  # type: ignore[union-attr]
        site = (kb.policy.device_of or kb.identity.public_key).hex()  # type: ignore[union-attr]
        requested = self._requests()
        ranked: list[Ranked] = []
        awaiting = kb.certificates.awaiting_check()
        for cert in awaiting:
            name = kb.skills.get(cert.skill).name
            first = cert.skill in requested
            why = "requested" if first else "spot check"
            job = Job("spot_check", cert.skill, name, cert.id, why, writer=cert.validator)
            ranked.append(Ranked((0 if first else 1, 0), cert.validator, cert.hlc, job))
        for skill in kb.skills.list() if self.settings.certifies else ():
            if not skill.tasks or kb.is_revoked(skill.id) or kb.is_active(skill.id):
                continue
            if any(c.skill == skill.id for c in awaiting):  # a spot check is cheaper
                continue
            if set(skill.tasks) <= self._certified_tasks(skill.id, own):
                continue
            uses = kb.counters.per_site(skill.id).get(site, knowledge.Counts()).uses
            first = skill.id in requested
            why = "requested" if first else f"used {uses} times here" if uses else "uncertified"
            job = Job("evaluate", skill.id, skill.name, why=why, writer=skill.author)
            ranked.append(Ranked((0 if first else 2, -uses), skill.author, skill.hlc, job))
        return taking_turns(
            (
                r
                for r in ranked
                if (t := self.troubles.get(r.job.key)) is None
                or (t.retry_at is not None and t.retry_at <= now)
            ),
            self.served,
        )

    def _certified_tasks(self, skill_id: str, validator: str) -> set[str]:
        """The hashes of the tasks `validator` has certified a skill on."""
        return {
            str((c.evaluation or {}).get("task", {}).get("hash"))
            for c in self.kb.certificates.for_skill(skill_id)
            if c.validator == validator
        }

    def _requests(self) -> set[str]:
        """The skills requested first: new requests (the requests file, consumed here) get a fresh
        try even if they had failed; a request lasts until its job succeeds."""
        path = self.home / REQUESTS_FILE if self.home else None
        if path is not None and path.exists():
            fresh = {line.strip() for line in path.read_text().splitlines() if line.strip()}
            path.unlink()
            self.requested |= fresh
            for key in [k for k, t in self.troubles.items() if t.job.skill in fresh]:
                del self.troubles[key]
        return self.requested

    # --- running ----------------------------------------------------------------------------------
    def step(self) -> Job | None:
        """Run the job at the head of the queue; None if there is none."""
        jobs = self.queue()
        if not jobs:
            self._save(jobs)
            return None
        job = jobs[0]
        self.served[job.writer] += 1
        started = time.monotonic()
        self._deadline = started + self.settings.max_job_s
        self.current = {**asdict(job), "done": 0, "total": 0, "started": time.time()}
        self._save(jobs[1:])
        try:
            if job.kind == "spot_check":
                self._spot_check(job)
            else:
                self._evaluate(job)
            self.troubles.pop(job.key, None)
            self.requested.discard(job.skill)
        except _Stopped:
            log.info(
                "stopped during %s %s: it is queued again at the next start", job.kind, job.name
            )
        except (_OverBudget, SceneOverBudget, PolicyOverBudget) as exc:
            self._trouble(job, f"over budget: {exc}", give_up=True)
        except _WAITING as exc:
            self._trouble(job, f"waiting: {exc}", waiting=True)
        except (knowledge.SimnetError, SimError) as exc:
            self._trouble(job, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a broken skill must not stop the service
            log.exception("validating %s failed", job.name)
            self._trouble(job, f"{type(exc).__name__}: {exc}")
        finally:
            self.totals["busy_s"] += time.monotonic() - started
            self.current = None
            self._save(self.queue())
        return job

    def run(self, stop: threading.Event) -> None:
        """Work until `stop` is set (an evaluation under way is abandoned at its next control step,
        with worker processes at its next wave), idling `idle_s` between looks at an empty queue."""
        log.info("validator %s started", self.kb.identity.key_id)  # type: ignore[union-attr]
        wanted = self.kb.policy.activation.min_branches
        if self.settings.certifies and self.settings.branches < wanted:
            log.warning(
                "validator.toml branches = %d is below this site's activation policy "
                "(min_branches = %d): its certificates will not activate skills here",
                self.settings.branches,
                wanted,
            )
        self._stop = stop
        idle_at, beat = None, 0.0  # what the knowledge base looked like when the queue was empty
        while not stop.is_set():
            if self._idle_key() == idle_at and time.monotonic() - beat < HEARTBEAT_S:
                stop.wait(self.settings.idle_s)  # nothing arrived: no queue to derive again
                continue
            if self.step() is None:
                self._sign_field_verdicts()
                idle_at, beat = self._idle_key(), time.monotonic()
                stop.wait(self.settings.idle_s)
            else:
                idle_at = None
        self._save(self.queue(), state="stopped")

    def _idle_key(self) -> tuple[Any, ...]:
        """What an empty queue depends on: the knowledge base's heads, a new request, a job whose
        retry fell due."""
        now = time.time()
        due = sum(1 for t in self.troubles.values() if t.retry_at is not None and t.retry_at <= now)
        requests = self.home is not None and (self.home / REQUESTS_FILE).exists()
        return self.kb.heads(), requests, due

    def _sign_field_verdicts(self) -> None:
        """Sign this site's field-test suspensions (and liftings): other sites see the evidence."""
        try:
            for skill_id in self.kb.ledger.publish_suspensions():
                log.warning("field test: %s", self.kb.activation(skill_id).reasons[0])
        except knowledge.SimnetError as exc:
            log.warning("could not sign field-test verdicts: %s", exc)

    def _evaluate(self, job: Job) -> None:
        s = self.settings
        named = {h: self.kb.tasks.get(h) for h in self.kb.skills.get(job.skill).tasks}
        if s.embodiments:
            named = {h: d for h, d in named.items() if d.get("embodiment") in s.embodiments}
            if not named:
                raise TaskDefinitionError(
                    "embodiment",
                    f"none of its tasks is for this fleet's bodies {list(s.embodiments)}",
                )
        done = self._certified_tasks(job.skill, self.kb.identity.public_key_hex)  # type: ignore[union-attr]
        named = {h: d for h, d in named.items() if h not in done}  # a restart resumes with the rest
        self._check_budget(named, job)  # before any scene is fetched or compiled
        budget = s.max_branch_macs
        check_policy_cost(self.kb.skills.get(job.skill).policy, named, budget=budget)
        policy = load_policy(self.kb, job.skill)  # the weights, fetched once the cost is known
        tasks = [self._compiled(d) for d in named.values()]
        for i, task in enumerate(tasks):
            sampler = s.sampler(task, self.rng.randrange(2**31), self.home)
            base = i * s.branches

            def progress(done: int, total: int, base: int = base) -> None:
                self._go_on(job)
                assert self.current is not None
                self.current.update(done=base + done, total=len(tasks) * total)
                self._save(None)

            result = evaluate(
                task,
                policy,
                branches=s.branches,
                sampler=sampler,
                workers=s.workers,
                threads=s.threads,
                progress=False,
                on_progress=progress,
                on_step=lambda: self._go_on(job),
            )
            found = None
            if s.probe_budget:
                self._go_on(job)
                found = probe(
                    task, policy, sampler=sampler, budget=s.probe_budget, threads=s.threads
                )
                self.totals["branches_evaluated"] += found.budget
            cert = certify(self.kb, job.skill, result, probe=found)
            self.totals["certificates"] += 1
            self.totals["branches_evaluated"] += result.n
            log.info(
                "certified %s on %s: %d/%d branches (%s)",
                job.name,
                task.name,
                result.successes,
                result.n,
                cert.id[:12],
            )

    def _go_on(self, job: Job) -> None:
        """_Stopped if the service was asked to stop, _OverBudget if the job has run longer than
        `max_job_s`: called between waves and after every control step, so neither waits for a slow
        scene's wave to end."""
        if self._stop.is_set():
            raise _Stopped
        if time.monotonic() > self._deadline:
            done = (self.current or {}).get("done", 0)
            raise _OverBudget(
                f"it ran for more than this site's budget of {self.settings.max_job_s:g} s, "
                f"{done} branches done: to validate it, raise max_job_s in {SETTINGS_FILE}, "
                f"restart, then `simnet validate --request {job.skill[:16]}`"
            )

    def _spot_check(self, job: Job) -> None:
        cert = self.kb.certificates.get(job.certificate or "")
        # the record is another validator's: its wave is the re-run's, bounded before anything runs
        wave = rerun_wave(cert.evaluation, max_wave=self.settings.max_rerun_wave, remedy=_REMEDY)
        task = (cert.evaluation or {}).get("task")  # `spot_check` checks the record itself
        if isinstance(task, dict) and isinstance(task.get("definition"), dict):
            self._check_budget({str(task.get("hash")): task["definition"]}, job)
            self._compiled(task["definition"], wave)
        result = spot_check(
            self.kb,
            cert,
            threads=self.settings.threads,
            rng=self.rng,
            on_step=lambda: self._go_on(job),  # a stop, and max_job_s, within a control step
        )
        self.totals["spot_checks"] += 1
        self.totals["branches_spot_checked"] += len(result.branches)
        if not result.reproduced:
            self.totals["disputes"] += 1
            log.warning("disputed certificate %s of %s: %s", cert.id[:12], job.name, result.detail)
        else:
            log.info("spot-checked %s of %s: %s", cert.id[:12], job.name, result.detail)

    def _check_budget(self, definitions: Mapping[str, Mapping[str, Any]], job: Job) -> None:
        """_OverBudget if a branch of each of the job's tasks (definitions by hash) takes more
        physics steps together than `max_branch_steps`: a skill naming many tasks costs as much as
        one long one. Read from the definitions, before anything is compiled (one `Task` would
        refuse is left to it)."""
        steps = {h: (d, n) for h, d in definitions.items() if (n := definition_steps(d))}
        budget, total = self.settings.max_branch_steps, sum(n for _, n in steps.values())
        if total <= budget:
            return
        longest, (definition, most) = max(steps.items(), key=lambda item: item[1][1])
        name = definition.get("name")
        what = (
            f"task {name} ({longest[:12]}) takes {definition['horizon']:,} x "
            f"{definition['control_substeps']:,} = {most:,} physics steps per branch "
            "(horizon x control_substeps)"
            if len(steps) == 1
            else f"its {len(steps)} tasks take {total:,} physics steps per branch together "
            f"(the longest, {name}, {most:,})"
        )
        raise _OverBudget(
            f"{what}, over this site's budget of {budget:,}: to validate it, raise "
            f"max_branch_steps in {SETTINGS_FILE}, restart, then "
            f"`simnet validate --request {job.skill[:16]}`"
        )

    def _compiled(self, definition: Mapping[str, Any], wave: int | None = None) -> Task:
        """The task compiled here, once a child process showed that its scene with `wave`
        simulations (default: a wave of this site's evaluations) fits this site's `max_scene_mb`
        and `max_compile_s` (SceneOverBudget if not)."""
        assets, s = fetch_assets(self.kb, definition), self.settings
        if wave is None:  # a wave of its evaluation, or of its probe (64)
            wave = DEFAULT_WAVE if s.probe_budget else min(s.branches, DEFAULT_WAVE)
        check_scene(
            definition,
            assets,
            max_mb=s.max_scene_mb,
            max_s=s.max_compile_s,
            wave=wave,
            threads=s.threads,
        )
        return Task(definition, assets)

    def _trouble(
        self, job: Job, reason: str, *, waiting: bool = False, give_up: bool = False
    ) -> None:
        old = self.troubles.get(job.key)
        attempts = (old.attempts if old else 0) + 1
        give_up = give_up or (not waiting and attempts >= self.settings.max_attempts)
        retry_at = None if give_up else time.time() + self.settings.retry_s * min(attempts, 10)
        self.troubles[job.key] = Trouble(job, reason, attempts, retry_at, waiting)
        log.warning("%s %s: %s", job.kind, job.name, reason)

    # --- state ------------------------------------------------------------------------------------
    def status(self, jobs: list[Job] | None = None, state: str | None = None) -> dict[str, Any]:
        t = self.totals
        busy = t["busy_s"]
        queue = self.queue() if jobs is None else jobs
        return {
            "pid": os.getpid(),
            "validator": self.kb.identity.public_key_hex,  # type: ignore[union-attr]
            "updated": time.time(),
            "state": state or ("busy" if self.current else "idle"),
            "current": self.current,
            "queued": len(queue),
            "queue": [asdict(j) for j in queue[:50]],
            **t,
            "branches_per_s": (t["branches_evaluated"] + t["branches_spot_checked"]) / busy
            if busy
            else 0.0,
            "requested": sorted(self.requested),
            "failed": [x.to_json() for x in self.troubles.values() if not x.waiting],
            "waiting": [x.to_json() for x in self.troubles.values() if x.waiting],
            "settings": {k: v for k, v in asdict(self.settings).items() if k != "samplers"},
        }

    def _save(self, jobs: list[Job] | None, state: str | None = None) -> None:
        if self.home is None:
            return
        data = self.status(jobs if jobs is not None else [], state)
        if jobs is None and self._last is not None:  # progress only: keep the queue we showed
            data["queue"], data["queued"] = self._last["queue"], self._last["queued"]
        self._last = data
        path = self.home / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    def _restore(self) -> None:
        """Totals and troubles from the last run's state file; a job it was running is queued
        again by itself (no certificate came of it)."""
        path = self.home / STATE_FILE if self.home else None
        if path is None or not path.exists():
            return
        with contextlib.suppress(ValueError, KeyError, TypeError):
            data = json.loads(path.read_text())
            for name in self.totals:
                self.totals[name] = type(self.totals[name])(data.get(name, 0))
            self.requested = set(data.get("requested", []))
            for waiting in (False, True):
                for x in data.get("waiting" if waiting else "failed", []):
                    job = Job(x["kind"], x["skill"], x["name"], x.get("certificate"), x["why"])
                    self.troubles[job.key] = Trouble(
                        job, x["reason"], x["attempts"], x["retry_at"], waiting
                    )
            if data.get("current"):
                log.warning(
                    "the last run stopped during %s %s: queued again",
                    data["current"]["kind"],
                    data["current"]["name"],
                )


def run_validator(home: SiteHome, kb: KnowledgeBase, stop: threading.Event) -> None:
    """The `simnet serve --validate` service: validate `kb` (the server's) until `stop` is set."""
    settings = ValidatorSettings.load(home.path / SETTINGS_FILE)
    Validator(kb, settings, home=home.path).run(stop)
