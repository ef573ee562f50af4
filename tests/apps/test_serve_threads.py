"""vit_fast.serve.threads: the torch thread count a served CPU forward runs with, kept by measured throughput."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import vit_fast
from vit_fast.backend import runtime
from vit_fast.serve import server as srv
from vit_fast.serve import threads as th


class Load:
    """A server under a steady load whose forwards on ``t`` threads take ``cycle(t)`` seconds of a fake clock each
    (the whole trip of a request: what the tuner sees between two forwards' starts)."""

    def __init__(self, cycle) -> None:
        self.now, self.cycle, self.used = 0.0, cycle, []

    def timer(self) -> float:
        return self.now

    def serve(self, tuner: th.ThreadTuner, forwards: int, batch: int = 1) -> None:
        for _ in range(forwards):
            t = tuner.threads_for(batch)
            self.used.append(t)
            self.now += self.cycle(t)  # the next request is already waiting: the server is never idle
            tuner.finished()

    def until_trial(self, tuner: th.ThreadTuner, batch: int = 1, limit: int = 100_000) -> None:
        """Serve until one more trial has finished."""
        before = len(tuner.trials)
        for _ in range(limit):
            self.serve(tuner, 1, batch)
            if len(tuner.trials) > before:
                return
        raise AssertionError("no trial finished")


def test_candidates() -> None:
    assert th.candidates(1) == [1]
    assert th.candidates(2) == [1, 2]
    assert th.candidates(6) == [1, 2, 4, 6]
    assert th.candidates(16) == [1, 2, 4, 8, 16]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="most must be an int >= 1"):
            th.candidates(bad)


@pytest.mark.parametrize(
    ("cycle_ms", "kept"),
    [
        ({1: 4.0, 2: 5.0}, 1),  # fewer threads clearly better (25 %)
        ({1: 4.0, 2: 3.0}, 2),
        ({1: 4.0, 2: 4.2}, 2),  # fewer threads better by 5 %, within MARGIN: the more threads kept
        ({1: 4.0, 2: 4.4}, 1),  # by 10 %: fewer
    ],
)
def test_a_trial_keeps_the_count_that_serves_more_images_per_second(cycle_ms, kept) -> None:
    load = Load(lambda t: cycle_ms[t] * 1e-3)
    tuner = th.ThreadTuner(2, timer=load.timer)
    assert tuner.current == 2  # before any request: torch's own count, every core
    load.until_trial(tuner)
    # the trial alternated the two counts in whole epochs of at least EPOCH_CALLS forwards and EPOCH_MIN_S,
    # the order rotating each round
    runs = [[load.used[0], 0]]
    for t in load.used[:-1]:
        if t == runs[-1][0]:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    order = [t for t, _ in runs]
    assert order == [1, 2, 1, 2, 1, 2, 1][: len(order)] or order == [2, 1, 2, 1, 2, 1, 2][: len(order)]
    for t, n in runs[:-1]:  # the last forward (which ended the trial) runs on the count kept
        assert n * cycle_ms[t] * 1e-3 >= th.EPOCH_MIN_S - 1e-9 and n >= th.EPOCH_CALLS
    assert tuner.current == kept and load.used[-1] == kept
    ((_, chosen, rates),) = tuner.trials
    assert chosen == kept
    assert rates == {t: pytest.approx(1e3 / ms, abs=0.05) for t, ms in cycle_ms.items()}  # rounded to 0.1
    # kept until the next trial, EVERY_S later
    start = len(load.used)
    load.serve(tuner, int(th.EVERY_S / (cycle_ms[kept] * 1e-3)) - 2)
    assert set(load.used[start:]) == {kept} and len(tuner.trials) == 1
    load.until_trial(tuner)  # the next trial
    assert len(tuner.trials) == 2 and tuner.trials[1][1] == kept


def test_the_load_changes_and_the_next_trial_follows_it() -> None:
    cycle_ms = {1: 4.0, 2: 3.0}
    load = Load(lambda t: cycle_ms[t] * 1e-3)
    tuner = th.ThreadTuner(2, timer=load.timer)
    load.until_trial(tuner)
    assert tuner.current == 2
    cycle_ms[2] = 400.0  # the machine got busy: two threads stall at every barrier
    began = load.now
    load.until_trial(tuner)
    assert tuner.current == 1 and tuner.trials[-1][1] == 1
    # a stalling count ends its epochs early (EPOCH_S): the trial that found it took seconds, not minutes
    assert load.now - began < th.EVERY_S + th.ROUNDS * (th.EPOCH_S + 0.4 + th.EPOCH_MIN_S + 0.01) + 1


def test_hill_climbing_tries_only_the_neighbours() -> None:
    # 16 cores: the best is 4; each trial moves at most one step from where it is
    cycle_ms = {1: 8.0, 2: 5.0, 4: 3.0, 8: 3.5, 16: 6.0}
    load = Load(lambda t: cycle_ms[t] * 1e-3)
    tuner = th.ThreadTuner(16, timer=load.timer)
    assert tuner.counts == [1, 2, 4, 8, 16]
    path = []
    for _ in range(5):
        load.until_trial(tuner)
        path.append(tuner.current)
    assert path == [8, 4, 4, 4, 4]
    assert set(tuner.trials[0][2]) == {8, 16}  # from the top: itself and the one below
    assert set(tuner.trials[-1][2]) == {2, 4, 8}


def test_one_lucky_epoch_does_not_move_the_count_down() -> None:
    # one thread is 5 % slower, but its first epoch ran while the rest of the machine was quiet (40x faster):
    # over the trial it is far ahead, yet it won one round of six, so the two threads stay
    load = Load(lambda t: (0.1e-3 if load.now < th.EPOCH_MIN_S else 4.2e-3) if t == 1 else 4.0e-3)
    tuner = th.ThreadTuner(2, timer=load.timer)
    load.until_trial(tuner)
    ((_, kept, rates),) = tuner.trials
    assert rates[1] > th.MARGIN * rates[2] and kept == 2 and tuner.current == 2


def test_a_pause_starts_a_new_trial_and_drops_the_one_it_interrupted() -> None:
    cycle_ms = {1: 4.0, 2: 3.0}
    load = Load(lambda t: cycle_ms[t] * 1e-3)
    tuner = th.ThreadTuner(2, timer=load.timer)
    load.until_trial(tuner)
    assert tuner.current == 2 and len(tuner.trials) == 1
    # clients stop for a while, then a new load comes, where one thread wins: tried at once, not EVERY_S later
    load.now += th.IDLE_S + 0.5
    cycle_ms[2] = 6.0
    began = load.now
    load.until_trial(tuner)
    assert tuner.current == 1 and load.now - began < th.EVERY_S / 2
    # a pause in the middle of a trial: that trial's epochs measured the pause; it is dropped and tried again
    load.now += th.EVERY_S
    load.serve(tuner, 40)  # a trial is running
    load.now += th.IDLE_S + 5.0
    load.until_trial(tuner)
    assert len(tuner.trials) == 3 and all(r < 400 for r in tuner.trials[-1][2].values())  # no 5 s in its epochs


def test_a_stalled_forward_is_not_a_pause() -> None:
    # two threads stall for 2 s per forward (longer than IDLE_S, but the forward is running): the trial ends
    # with one thread kept, it is not started over
    load = Load(lambda t: 2.0 if t == 2 else 4e-3)
    tuner = th.ThreadTuner(2, timer=load.timer)
    load.until_trial(tuner, limit=10_000)
    assert tuner.current == 1 and len(tuner.trials) == 1


def test_batch_sizes_count_as_images() -> None:
    # 1 thread: batches of 8 every 4 ms; 2 threads: the same cycle: a tie broken by the images, not the forwards
    load = Load(lambda t: 4e-3)
    tuner = th.ThreadTuner(2, timer=load.timer)
    i = 0
    while not tuner.trials:
        tuner.threads_for(8 if i % 2 == 0 else 1)
        load.now += 4e-3
        tuner.finished()
        i += 1
    rates = tuner.trials[0][2]
    # 4.5 images per 4 ms forward, not 1 forward per 4 ms (an epoch may hold one more batch of 8 than of 1)
    assert rates[1] == pytest.approx(4.5 / 4e-3, rel=0.03) and rates[2] == pytest.approx(4.5 / 4e-3, rel=0.03)


def test_each_trial_can_be_reported_as_it_ends() -> None:
    said: list[str] = []
    load = Load(lambda t: 5e-3 if t == 1 else 3e-3)
    tuner = th.ThreadTuner(2, timer=load.timer, on_trial=said.append)
    load.until_trial(tuner)
    assert said == ["torch threads trial: images/s 1: 200, 2: 333.3; kept 2"]


def test_one_core_each_has_nothing_to_try() -> None:
    load = Load(lambda t: 1e-3)
    tuner = th.ThreadTuner(1, timer=load.timer)
    load.serve(tuner, 500)
    assert set(load.used) == {1} and tuner.trials == []
    assert tuner.describe() == "1 torch thread(s) each"


def test_the_server_tunes_threads_on_the_cpu_unless_told(monkeypatch) -> None:
    model = vit_fast.load_model("default", backend="torch")
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 2)
    tuned = srv.Server(model)
    assert tuned.threads == 2 and tuned.thread_tuner is not None and tuned.thread_tuner.counts == [1, 2]
    assert "torch threads 1/2 each, the count that serves the most images/s kept" in tuned.description
    fixed = srv.Server(model, threads=2)
    assert fixed.thread_tuner is None and "2 torch thread(s) each" in fixed.description  # --threads fixes one
    assert srv.Server(model, instances=2).thread_tuner is None  # one core each: nothing to choose
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 16)
    assert srv.Server(model, instances=3).thread_tuner.counts == [1, 2, 4, 5]


def test_served_forwards_run_on_the_tuners_count_in_the_instance_thread(monkeypatch) -> None:
    """Each instance thread sets its own torch count per forward to what the tuner says, and the answers are the
    model's whatever the count."""
    model = vit_fast.load_model("default", backend="torch").eval()
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 2)
    server = srv.Server(model)
    said = iter([1, 2, 2, 1])
    monkeypatch.setattr(server.thread_tuner, "threads_for", lambda batch: next(said))
    before = torch.get_num_threads()
    seen: list[int] = []
    gen = np.random.default_rng(0)

    def instance() -> None:
        for batch in (1, 8, 3, 16):
            images = gen.standard_normal((batch, *server.input.dims)).astype(np.float32)
            out = server.infer(images)[server.output.name]
            seen.append(torch.get_num_threads())
            with torch.inference_mode():
                want = server.model(torch.from_numpy(images)).numpy()
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)

    worker = threading.Thread(target=instance)
    worker.start()
    worker.join()
    assert seen == [1, 2, 2, 1]
    assert torch.get_num_threads() == before  # this thread's count is its own


def test_many_instance_threads_share_one_tuner() -> None:
    tuner = th.ThreadTuner(2)
    counts: list[int] = []

    def instance() -> None:
        for _ in range(300):
            counts.append(tuner.threads_for(1))
            tuner.finished()

    workers = [threading.Thread(target=instance) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(counts) == 1200 and set(counts) <= {1, 2}  # (real time: a trial may or may not have finished)
