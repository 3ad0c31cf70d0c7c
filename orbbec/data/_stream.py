"""The GPU path's background threads: one takes the workers' batches off the DataLoader (unpickling),
one decodes them and one warps them, both on the loader's side stream (stream order keeps each warp
after its decode); the consumer's stream waits on an event per batch, so nothing synchronises the host.

The threads outlive an epoch: with the loader's own order they go on into the next epochs' batches
while the consumer finishes this one, so an epoch boundary does not empty the pipeline (restarting it
cost about one batch's decode and the workers' first batch per epoch: 5-9% of a 64-batch epoch, and
the training step's GPU idled meanwhile). Each batch carries its key (epoch, seed, indices); the
consumer checks it against the key it expects, so a stream that guessed wrong (set_epoch to another
epoch, a changed seed, a resume) is replaced, never served."""
from __future__ import annotations

import atexit
import gc
import os
import queue
import threading
import time
import weakref

import torch

from ._reorder import MISSING, BatchError, InOrder, seq_of
from ._shared import map_leaves
from ._stages import augment_batch, finish_decode, start_decode_batch

DONE = object()

# Batches started and not yet finished by the decoding thread: it starts batch N+1 before it takes
# batch N (with the decode and its Python in turn, the decoder stood idle for a tenth of each batch).
DECODES_IN_FLIGHT = 2

# Batches received from the workers and not yet started. The workers' batches arrive in order and
# in bursts (one late worker holds back the batches after its own): with room for 2 the decoding
# thread waited for the next face batch of 256 about 1 ms, with 6 less and face ran faster in one
# alternated A/B (docs/dev/decode.md). The bytes of the batches held here are not copied.
RECEIVED_DEPTH = 6


# Streams whose threads may still run: closed at interpreter exit, before Python ends its daemon
# threads. A thread ended then while it waited for the GPU decoder (it takes the GIL back in a C++
# destructor) aborted the process ("terminate called without an active exception"); with the
# threads reading into the next epoch, every script that ended with its loader alive did.
_LIVE: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _close_all():
    for s in list(_LIVE):
        s.close()


# The loader's workers never collect what they inherit: a reference cycle holding a CUDA tensor,
# collected in a worker, freed it there, and CUDA aborted the forked process (seen in the CUDA tests;
# likely a block used on another stream, whose free records CUDA events). So the parent pauses its
# collector for the instant of each fork (no collection can start in the child before its hook runs),
# and the child freezes all it inherited (gc.freeze splices lists: no object is written).
# The parent's heap is never frozen: freezing it around the fork and thawing after cannot tell the
# user's own freeze from ours (Python 3.12 starts with objects already frozen), and a heap left
# frozen is never fully collected. Forks from several threads at once are counted; the last one out
# turns the collector back on if it was on when the first one paused it.
class _Starting(threading.local):
    workers = False  # this thread is inside start_workers


_starting = _Starting()
_pauses_lock = threading.Lock()
_pauses = 0
_collector_was_on = True


def _pause_before_fork() -> None:
    global _pauses, _collector_was_on
    if _starting.workers:
        with _pauses_lock:
            if _pauses == 0:
                _collector_was_on = gc.isenabled()
                gc.disable()
            _pauses += 1


def _resume_after_fork() -> None:
    global _pauses
    if _starting.workers:
        with _pauses_lock:
            _pauses -= 1
            if _pauses == 0 and _collector_was_on:
                gc.enable()


def _freeze_in_child() -> None:
    """The child freezes what it inherited, and starts afresh: the count and lock (another thread
    may have held the lock at the fork), the thread flag (the forking thread's, not the child's)."""
    global _pauses_lock, _pauses
    if _starting.workers:
        gc.freeze()
        if _collector_was_on:
            gc.enable()
    _pauses_lock, _pauses = threading.Lock(), 0
    _starting.workers = False


os.register_at_fork(before=_pause_before_fork, after_in_parent=_resume_after_fork,
                    after_in_child=_freeze_in_child)


def start_workers(reader):
    """iter(reader); the workers it forks (the first time) freeze the heap they inherit (above)."""
    _starting.workers = True
    try:
        return iter(reader)
    finally:
        _starting.workers = False


def batch_taker(batches):
    """next() of a DataLoader iterator, less its per-batch profiler range unless a profiler runs.
    The range cost the receiving thread a fifth to a quarter of its host time per batch (detection,
    batches of 64: H200 host 0.60-0.69 against 0.51-0.52 ms; dev machine 0.87 against 0.64), time
    in which it holds the GIL the decoding thread waits for. An iterator without _next_data (torch's
    private step inside next()) keeps next()."""
    inner = getattr(batches, "_next_data", None)
    if inner is None or getattr(batches, "_sampler_iter", None) is None:
        return batches.__next__
    profiling = torch.autograd._profiler_enabled

    def take():
        return batches.__next__() if profiling() else inner()
    return take


class Counters:
    """The loader's timing record, shared by the loader and its stream (which must not point back at
    the loader: its threads would keep it alive)."""

    def __init__(self, timing):
        self.timing = timing  # replaced whole by GPULoader.timing(reset=True)


class GpuStream:
    """The batches of `reader` (a DataLoader over the loader's keys), decoded and augmented on the
    CUDA `stream`, `prefetch` batches ahead; next_batch() hands one over to the current stream."""

    def __init__(self, reader, cfg, counters: Counters, stream, prefetch: int):
        self.reader, self.cfg, self.counters, self.stream = reader, cfg, counters, stream
        self.device = cfg.device
        self.queue: "queue.Queue" = queue.Queue(maxsize=prefetch)
        self.received: "queue.Queue" = queue.Queue(maxsize=RECEIVED_DEPTH)
        self.decoded: "queue.Queue" = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.finished = False  # DONE or an exception was handed out: nothing more will come
        self.in_order = InOrder()  # a batch's error comes before the batches still in flight before it
        self.threads = [threading.Thread(target=self._receive, name="orbbec-loader-receive", daemon=True),
                        threading.Thread(target=self._decode, name="orbbec-loader-decode", daemon=True),
                        threading.Thread(target=self._augment, name="orbbec-loader-augment", daemon=True)]
        _LIVE.add(self)
        for t in self.threads:
            t.start()

    # the consumer's side ------------------------------------------------------------------------
    def next_batch(self):
        """The next batch, ready on the current stream; StopIteration when the plan has ended."""
        if self.finished:
            raise StopIteration
        item = self.in_order.pop()
        while item is MISSING:
            got = self.queue.get()
            if got is DONE or isinstance(got, BaseException):
                self.finished = True
                self.close()
                if got is DONE and self.in_order.early:  # every batch before DONE has come: cannot happen
                    raise RuntimeError(f"GPULoader: batch {self.in_order.next} of the pass never came")
                if got is DONE:
                    raise StopIteration
                raise got
            self.in_order.add(got)
            item = self.in_order.pop()
        if isinstance(item, BatchError):
            self.finished = True
            self.close()
            item.reraise()
        batch, event = item
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for t in _tensors(batch):
            if t.is_cuda:
                t.record_stream(consumer)  # the allocator must not reuse them before the consumer is done
        return batch

    def close(self):
        self.stop.set()
        for t in self.threads:
            if t.is_alive() and threading.current_thread() is not t:
                t.join(timeout=10)

    # the threads --------------------------------------------------------------------------------
    def _put(self, item, q=None) -> bool:
        q = self.queue if q is None else q
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _items(self, q):
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                if self.stop.is_set():  # closed early: the stage before has stopped too
                    return
                continue
            if item is DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _receive(self):
        """The DataLoader hands the batches over in order, so an exception its iterator raises (the
        dataset's, re-raised from a worker by torch) is that of the batch after the last one received."""
        next_seq = 0
        try:
            take = batch_taker(start_workers(self.reader))
            while True:
                try:
                    batch = take()
                except StopIteration:
                    break
                except Exception as e:  # noqa: BLE001 (raised in the consumer, at the batch's place)
                    self._put(BatchError(next_seq, e), self.received)
                    break
                next_seq = seq_of(batch) + 1
                batch.unpack(self.cfg.slots)
                if not self._put(batch, self.received):
                    return
            self._put(DONE, self.received)
        except BaseException as e:  # handed on, raised in the consumer
            self._put(e, self.received)

    def _decode(self):
        """Starts each batch's decode, then finishes the oldest started one (DECODES_IN_FLIGHT), so
        that the decoder works on one batch while this thread's Python takes the previous one's
        results and receives the next."""
        pending = []  # [batch, its started decode, seconds waited for it], started and not yet finished
        try:
            torch.cuda.set_device(self.device)
            with torch.cuda.stream(self.stream):
                t = time.perf_counter()
                for batch in self._items(self.received):
                    if self.stop.is_set():
                        return
                    waited = time.perf_counter() - t
                    started, error = self._start(batch)
                    if error is not None:  # passed on to its batch's place in the order
                        if not self._put(error, self.decoded):
                            return
                        t = time.perf_counter()
                        continue
                    pending.append((batch, started, waited))
                    if len(pending) >= DECODES_IN_FLIGHT and not self._finish(*pending.pop(0)):
                        return
                    t = time.perf_counter()
                while pending:
                    if not self._finish(*pending.pop(0)):
                        return
            self._put(DONE, self.decoded)
        except BaseException as e:  # handed on, raised in the consumer
            self._put(e, self.decoded)
        finally:
            # Stopped, or a batch raised: what was started is still decoded; its bytes are released
            # once the decoder is done reading them (the workers reuse those buffers).
            for batch, started, _ in pending:
                self._abandon(batch, started)

    def _start(self, batch):
        """(the batch's started decode, None), or (None, the BatchError to pass on in its place): a
        worker's error, or this batch's own."""
        if isinstance(batch, BatchError):
            return None, batch
        try:
            return start_decode_batch(self.cfg, batch), None
        except BaseException as e:
            self._release(batch)
            if not isinstance(e, Exception):  # an interrupt or exit stops the thread; an error is the batch's
                raise
            return None, BatchError(seq_of(batch), e)

    def _abandon(self, batch, started):
        """A started batch that will not be finished: its bytes are released once the decoder is
        done reading them."""
        try:
            if started is not None:
                started.result()
        except BaseException:  # noqa: BLE001 (the exception that stops the loader is the earlier one)
            pass
        self._release(batch)

    def _release(self, batch):
        """The batch's shared bytes are free once the GPU work queued so far has run."""
        if batch.slot is not None:
            event = torch.cuda.Event()
            event.record(self.stream)
            self.cfg.slots.release_after(*batch.slot, event)
            batch.slot = None

    def _finish(self, batch, started, waited) -> bool:
        try:
            finish_decode(self.cfg, batch, started)
        except Exception as e:  # noqa: BLE001 (raised in the consumer, at the batch's place)
            return self._put(BatchError(seq_of(batch), e), self.decoded)
        finally:
            self._release(batch)
        x = batch.extra
        t = time.perf_counter()
        if not self._put(batch, self.decoded):
            return False
        self.counters.timing.add(workers=waited, decode=x.get("decode_s", 0.0), decode_native=x.get("native_s", 0.0),
                                 decode_gil=x.get("gil_s", 0.0), augment_wait=time.perf_counter() - t)
        return True

    def _augment(self):
        try:
            torch.cuda.set_device(self.device)
            with torch.cuda.stream(self.stream):
                for batch in self._items(self.decoded):
                    if self.stop.is_set():
                        return
                    t1 = time.perf_counter()
                    error = batch if isinstance(batch, BatchError) else self._augment_one(batch)
                    if error is not None:  # raised in the consumer, at its batch's place
                        if not self._put(error):
                            return
                        continue
                    event = torch.cuda.Event()
                    event.record(self.stream)
                    t2 = time.perf_counter()
                    if not self._put((batch, event)):
                        return
                    self.counters.timing.add(batch_done=True, augment=t2 - t1, consumer=time.perf_counter() - t2)
            self._put(DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)

    def _augment_one(self, batch):
        """Warps the batch and moves its targets to the GPU; None, or the BatchError to pass on in
        its place."""
        try:
            augment_batch(self.cfg, batch)
            _pin_and_move(batch, self.device)
        except Exception as e:  # noqa: BLE001 (raised in the consumer, at the batch's place)
            return BatchError(seq_of(batch), e)
        return None


def _tensors(batch):
    stack = [batch.images, batch.targets, batch.params.matrices if batch.params is not None else None]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


# Targets up to this size go to the GPU straight from pageable memory: cudaMemcpyAsync stages them
# at once (without waiting for the device), and pinning first cost more host time (and GIL) than
# the copy of a batch's labels.
PAGEABLE_COPY_BYTES = 1 << 16


def _pin_and_move(batch, device) -> None:
    """Targets to the GPU, asynchronously on the current (side) stream: large ones from pinned memory."""
    def move(v):
        if not isinstance(v, torch.Tensor) or v.device.type != "cpu":
            return v
        small = v.numel() * v.element_size() <= PAGEABLE_COPY_BYTES
        return (v if small else v.pin_memory()).to(device, non_blocking=True)
    batch.targets = map_leaves(move, batch.targets)
