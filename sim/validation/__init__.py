"""The validator service: a site with the validate role certifies skills and spot-checks other
sites' certificates from the simulator by itself (`simnet validate`, `simnet serve --validate`).

`Validator` holds no queue of its own: it derives one from the knowledge base each time, so a
validator killed mid-evaluation resumes where it stood. Its state (progress, throughput, jobs that
failed or wait, and why) goes to ``validator.json`` in the site's home for `simnet status`, the
status page and /metrics.
"""

from ._jobs import Job
from ._samplers import fleet_sampler
from ._settings import ValidatorSettings
from ._validator import Validator, run_validator

__all__ = ["Job", "Validator", "ValidatorSettings", "fleet_sampler", "run_validator"]
