"""What a skill's network costs to roll out, read from its record before its weights are fetched.

The step budget (`max_branch_steps`) bounds the physics, not the policy: a network of 16 layers of
2,048 units (256 MB of weights, within what a policy may carry) takes a few hundred million
multiply-adds per control step and simulation, so one skill kept a validator busy for hours while
every other writer's waited. The validator refuses, unstarted, a skill whose network takes more
multiply-adds per branch over its tasks' control steps together than `max_branch_macs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from .._errors import PolicySpecError
from .._mlp_spec import MLPSpec
from .._tasks import definition_steps


class PolicyOverBudget(Exception):
    """A skill's network takes more multiply-adds per branch than the site allows."""


def check_policy_cost(
    policy: Any, definitions: Mapping[str, Mapping[str, Any]], *, budget: int
) -> None:
    """PolicyOverBudget if an MLP `policy` record over the control steps (`horizon`) of a branch
    of each task definition takes more than `budget` multiply-adds. A record that is no valid
    MLP passes: loading it says what is wrong."""
    if not isinstance(policy, dict) or policy.get("kind") != "mlp":
        return
    try:
        spec = MLPSpec.from_json(policy.get("architecture"))
    except PolicySpecError:
        return
    per_step = sum(a * b for a, b in pairwise([spec.obs_dim, *spec.hidden, spec.act_dim]))
    steps = sum(d["horizon"] for d in definitions.values() if definition_steps(d))
    if per_step * steps > budget:
        raise PolicyOverBudget(
            f"its network takes {per_step:,} multiply-adds a control step, {per_step * steps:,} "
            f"over the {steps:,} control steps of a branch of its tasks, over this site's budget "
            f"of {budget:,} (max_branch_macs in validator.toml: to validate it, raise it, restart "
            "and request the skill)"
        )
