"""Executors: a shard host run inline, in a worker process and (see test_world_backends) in a Ray
actor; the same calls, the same bits, and a worker's death reported."""

import os
import signal

import pytest

from sim import Event, Mutation, Template
from sim.evaluation._executors import InlineWorker, ProcessWorker, WorkerLost
from sim.world._engine import initial_checkpoint
from sim.world._entities import compose
from sim.world._hosts import ShardHost, host_worker


@pytest.fixture(scope="module")
def template(region, world_entities):
    return Template(compose(region, world_entities))


def _load_args(template):
    return (initial_checkpoint(template).to_json(), template.xml, 50, 0, [])


def _ctrl(seq, tick, value):
    return Event(
        seq,
        tick,
        "walker1",
        "mutate",
        {"mutations": [Mutation("actuator/walker1/hhip/ctrl", "set", (value,)).to_json()]},
        "t",
    )


def test_a_worker_process_runs_the_host_and_its_death_is_reported(template):
    worker = host_worker("process")
    assert isinstance(worker, ProcessWorker) and worker.pid != os.getpid()
    worker.call("load", "", *_load_args(template))()
    assert worker.call("advance", "", 60, [_ctrl(1, 0, 0.5)])()["tick"] == 60
    pid = worker.pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerLost):
        worker.call("state", "")()
    worker.restart()
    assert worker.pid != pid
    with pytest.raises(
        KeyError
    ):  # a new process: its engines are gone until the world reloads them
        worker.call("state", "")()
    worker.close()


def test_an_inline_calls_error_is_raised_on_wait_not_on_issue(template):
    worker = InlineWorker(ShardHost)
    failed = worker.call("advance", "", 10, [])  # no engine loaded yet
    loaded = worker.call("load", "", *_load_args(template))
    with pytest.raises(KeyError):
        failed()
    assert loaded()["tick"] == 0 and worker.call("advance", "", 10, [])()["tick"] == 10


def test_inline_and_process_workers_compute_the_same_bits(template):
    results = []
    for worker in (InlineWorker(ShardHost), host_worker("process")):
        worker.call("load", "", *_load_args(template))()
        worker.call("advance", "", 200, [_ctrl(1, 0, 0.3), _ctrl(2, 77, -0.6)])()
        results.append(worker.call("state", "")())
        worker.close()
    assert results[0] == results[1]
    with pytest.raises(ValueError, match="backend must be one of"):
        host_worker("threads")
