"""orbbec.data's decoding thread (GpuStream._decode) on the CPU: the order in which it starts, waits for
and hands over batches, and what becomes of a batch whose decode fails. The GPU's calls are replaced by
fakes that log their order; the real decoder under the same loop is in test_data.py and test_io_cuda.py."""
import contextlib
import gc
import os
import sys
import threading
import time
import types

import pytest
import torch

import orbbec.data._stream as stream
from orbbec.data._epoch import Timing


class Started:
    """A started decode: done after a short while; raises for the batches in `failing`."""

    def __init__(self, batch, log, failing):
        self.seq, self.log, self.failing, self.done = batch.extra["seq"], log, failing, False
        log.append(("start", self.seq))

    def result(self):
        if not self.done:
            time.sleep(0.001)
            self.log.append(("done", self.seq))
            self.done = True
        if self.seq in self.failing:
            raise RuntimeError(f"decode of batch {self.seq} failed")
        return [], []


@pytest.fixture
def fake_gpu(monkeypatch):
    """The stream's GPU calls faked; returns (log, set of batches whose decode fails). Only this
    file's batches (FAKE in their extra) take the fakes: a stream an earlier test left reading ahead
    (its loader not yet collected) may still call the module's functions while a test here runs,
    and once its batches' starts landed in this test's log (under pytest -n 8)."""
    # Streams earlier tests left reading ahead are stopped first: the fakes below replace torch.cuda's
    # Event for the whole process, and one such stream's decoding thread, releasing a slot with a
    # fake event, raised in the GPU machine's run.
    stream._close_all()
    log, failing = [], set()
    real_start, real_finish = stream.start_decode_batch, stream.finish_decode
    real_augment, real_move = stream.augment_batch, stream._pin_and_move

    def ours(batch):
        return FAKE in batch.extra

    def start(cfg, batch):
        return Started(batch, log, failing) if ours(batch) else real_start(cfg, batch)

    def finish(cfg, batch, started):
        if not ours(batch):
            return real_finish(cfg, batch, started)
        started.result()
        log.append(("handed over", batch.extra["seq"]))

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", lambda: types.SimpleNamespace(record=lambda s=None: None))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: types.SimpleNamespace(wait_event=lambda e: None))
    monkeypatch.setattr(stream, "start_decode_batch", start)
    monkeypatch.setattr(stream, "finish_decode", finish)
    monkeypatch.setattr(stream, "augment_batch", lambda cfg, b: None if ours(b) else real_augment(cfg, b))
    monkeypatch.setattr(stream, "_pin_and_move", lambda b, device: None if ours(b) else real_move(b, device))
    monkeypatch.setattr(stream, "start_workers", iter)
    return log, failing


FAKE = "test_data_stream"  # the key in a fake batch's extra


def batches(n, worker_error_at=None):
    """The workers' batches as the DataLoader hands them over; a worker's error is raised by its
    iterator in the batch's place (torch re-raises it there)."""
    for k in range(n):
        if k == worker_error_at:
            raise ValueError(f"worker failed on batch {k}")
        yield types.SimpleNamespace(slot=None, extra={"seq": k, FAKE: True}, indices=[k], images=None, targets=None,
                                    params=None, unpack=lambda slots: None)


def drain(items):
    """The sequence numbers handed out, in order, and the exception that ended them (or None)."""
    s = stream.GpuStream(items, types.SimpleNamespace(slots=None, device="cpu"), stream.Counters(Timing()), None, 2)
    out = []
    try:
        while True:
            out.append(s.next_batch().extra["seq"])
    except StopIteration:
        return out, None
    except Exception as e:  # noqa: BLE001 (returned to the test)
        return out, e
    finally:
        s.close()


def test_oldest_is_handed_over_before_the_next_decode_starts(fake_gpu):
    """Each batch's decode starts after the oldest started one is handed over, DECODES_IN_FLIGHT
    are started before the first hand-over, and every batch comes out in order. (Starting the next
    before that hand-over was measured slower on det: docs/dev/decode.md.)"""
    log, _ = fake_gpu
    n = 10
    out, error = drain(batches(n))
    assert error is None and out == list(range(n))
    k = stream.DECODES_IN_FLIGHT
    for j in range(k, n):
        assert log.index(("handed over", j - k)) < log.index(("start", j)), log
    assert log.index(("start", k - 1)) < log.index(("handed over", 0)), log


@pytest.mark.parametrize("bad", [0, 3, 7])
def test_failed_decode_comes_out_at_its_place(fake_gpu, bad):
    """A batch whose decode raises comes out as its own error, after every batch before it, which
    are not lost."""
    _, failing = fake_gpu
    failing.add(bad)
    out, error = drain(batches(8))
    assert out == list(range(bad))
    assert isinstance(error, RuntimeError) and f"batch {bad} failed" in str(error)


def test_worker_error_comes_out_at_its_place(fake_gpu):
    """A worker's error comes after the batches before it, which were still decoding when it came."""
    out, error = drain(batches(8, worker_error_at=4))
    assert out == [0, 1, 2, 3]
    assert isinstance(error, ValueError) and "batch 4" in str(error)


@pytest.mark.parametrize("workers", [0, 2])
def test_receiving_thread_takes_every_batch_in_order_with_the_profiler_range_only_when_profiling(workers):
    """batch_taker skips the DataLoader's per-batch profiler range (host time the receiving thread
    holds the GIL for) but gives the same batches in the same order, and keeps the range while a
    profiler runs, so that a user's profile still shows it."""
    reader = torch.utils.data.DataLoader(list(range(10, 19)), batch_size=2, num_workers=workers)
    batches = iter(reader)
    take = stream.batch_taker(batches)
    got = [take().tolist() for _ in range(2)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got.append(take().tolist())
    got += [take().tolist() for _ in range(2)]
    assert got == [[10, 11], [12, 13], [14, 15], [16, 17], [18]]
    assert any(e.name.startswith("enumerate(DataLoader)") for e in prof.events())
    assert batches._num_yielded == 1  # only the profiled batch went through next()
    with pytest.raises(StopIteration):
        take()


def test_receiving_thread_falls_back_to_next_for_other_iterators():
    items = iter([1, 2])
    take = stream.batch_taker(items)
    assert (take(), take()) == (1, 2)


class Forking:
    """A reader whose iter() forks a child that exits at once, as a DataLoader forks its workers; the
    child's exit status says whether it found an object of its parent's frozen (bit 0) and its
    collector on (bit 1). `wait` (an Event) holds iter() before the fork."""

    def __init__(self, wait=None):
        self.wait, self.children = wait, []
        self.inherited = [self]  # a container made before the fork: tracked by the collector

    def __iter__(self):
        if self.wait is not None:
            self.wait.wait(10)
        pid = os.fork()
        if pid == 0:
            frozen = not any(o is self.inherited for o in gc.get_objects())  # frozen ones are left out
            os._exit(int(frozen) | 2 * gc.isenabled())
        self.children.append(pid)
        return iter([])

    def children_found(self):
        """(frozen, collector on) for each child."""
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in self.children]
        return [(bool(c & 1), bool(c & 2)) for c in codes]


def test_workers_freeze_what_they_inherit_and_the_parents_heap_is_left_as_it_was():
    """start_workers' children freeze the heap they inherit (they never collect it); the parent's
    heap is never frozen by the start (Python 3.12 starts with some objects frozen: the count is
    compared, not taken for zero), and a heap the user froze stays frozen."""
    assert gc.isenabled()
    before = gc.get_freeze_count()
    try:
        reader = Forking()
        stream.start_workers(reader)
        assert gc.get_freeze_count() == before and gc.isenabled()
        gc.freeze()
        stream.start_workers(reader)
        # (still frozen: frozen objects freed since lower the count, a thaw would bring it to zero)
        assert gc.get_freeze_count() > before + 1000
        assert reader.children_found() == [(True, True), (True, True)]
    finally:
        gc.unfreeze()


def test_a_collector_the_user_turned_off_stays_off_in_parent_and_workers():
    gc.disable()
    try:
        reader = Forking()
        stream.start_workers(reader)
        assert not gc.isenabled()
        assert reader.children_found() == [(True, False)]
    finally:
        gc.enable()


def test_a_start_that_waits_leaves_the_heap_collectable_meanwhile():
    """A start can wait long before it forks (DataLoader's persistent workers finish their queued
    batches first): meanwhile the collector is on and the heap not frozen."""
    before = gc.get_freeze_count()
    go = threading.Event()
    reader = Forking(wait=go)
    t = threading.Thread(target=stream.start_workers, args=(reader,))
    t.start()
    try:
        time.sleep(0.2)  # the thread is inside start_workers, waiting
        assert t.is_alive() and gc.isenabled() and gc.get_freeze_count() == before
    finally:
        go.set()
        t.join()
    assert reader.children_found() == [(True, True)]
    assert gc.isenabled() and gc.get_freeze_count() == before


def test_workers_started_from_several_threads_leave_the_collector_on_and_the_heap_thawed():
    """Loaders start their workers from several threads (each GPU stream's receiving thread, beside
    the user's thread starting a CPU loader's): however their pauses and resumes interleave, every
    child starts frozen with its collector on, and the parent's collector is on again after."""
    before = gc.get_freeze_count()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between nearly every bytecode: the races show
    readers = [Forking() for _ in range(4)]
    try:
        def start_many(reader):
            for _ in range(40):
                stream.start_workers(reader)

        threads = [threading.Thread(target=start_many, args=(r,)) for r in readers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert gc.isenabled() and gc.get_freeze_count() == before
        assert all(found == (True, True) for r in readers for found in r.children_found())
    finally:
        sys.setswitchinterval(switch)
