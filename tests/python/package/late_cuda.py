"""A stand-in for CUDA that does to a host program what the hardware does: work queued on a stream
runs later, in the stream's order, and a copy from page-locked (registered) host memory reads
its source bytes when it runs, not when it is queued.

CI has no GPU, and a recording backend cannot see a block handed back to its worker while a copy
from it is still queued (the bug ../shared/gpu-checks/gpu_correct2.py found on a GPU: 90 of 128
batches wrong). This one can: it is put in place of ``_device.BACKEND``, and the test plays the
user's part with :meth:`LateCuda.to_device` (``t.to("cuda", non_blocking=True)`` on the current
stream) and :meth:`LateCuda.snapshot` (a kernel on the current stream reading device memory,
as ``gpu_correct.py``'s clone right after the copy).

The model, as CUDA's documentation states it:
- time is a logical clock the test advances (:meth:`tick`, once per training step); a copy is
  due ``lag`` ticks after it was queued, any other operation at once; a stream runs its
  operations in order, each once it is due and the events it waits for have completed;
- ``cudaMemcpyAsync`` from pageable memory stages the source before it returns (the source may be
  reused at once); from registered memory it reads the source when it runs, through the raw
  address (the op holds no reference to the tensor: freeing the tensor does not delay it);
- ``Event.query()`` says whether the stream reached the event; ``synchronize()`` waits for it
  (runs the stream up to it, due or not);
- ``cudaHostUnregister`` of memory that a queued copy still reads is undefined in CUDA: noted in
  ``violations``."""

import ctypes
import collections

import torch

SENTINEL = 0xA5  # device memory a copy has not reached yet


class _Op:
    __slots__ = ("due", "deps", "run", "done", "reads")

    def __init__(self, due, deps, run, reads=()):
        self.due, self.deps, self.run, self.done, self.reads = due, deps, run, False, reads


class LateStream:
    def __init__(self, cuda, name):
        self.cuda, self.name, self.ops = cuda, name, collections.deque()

    def __repr__(self):
        return f"LateStream({self.name})"


class LateEvent:
    def __init__(self, stream, op):
        self.stream, self.op = stream, op

    def query(self):
        self.stream.cuda.run()
        return self.op.done

    def synchronize(self):
        self.stream.cuda.run(through=self.op)


class LateCuda:
    def __init__(self, lag=4):
        self.lag, self.clock = lag, 0
        self.current = LateStream(self, "current")
        self.streams = [self.current]
        self.registered = {}  # data_ptr -> the registered block (kept: its mapping stays valid)
        self.registrations = self.unregistrations = self.pins = 0
        self.late_copies = 0  # copies that read a registered block when they ran
        self.violations = []  # what CUDA leaves undefined, done by the loader
        self.kept = []  # unregistered blocks

    # -- the clock and the streams ------------------------------------------------------------
    def tick(self, n=1):
        self.clock += n
        self.run()

    def run(self, through=None):
        """Runs every stream's due operations in order; ``through``: that op and all it needs
        run even if not due (a wait on it)."""
        forced = set()
        if through is not None:
            self._force(through, forced)
        progress = True
        while progress:
            progress = False
            for s in self.streams:
                while s.ops:
                    op = s.ops[0]
                    if not ((op.due <= self.clock or id(op) in forced) and all(d.done for d in op.deps)):
                        break
                    s.ops.popleft()
                    op.run()
                    op.done = progress = True
        if through is not None:
            assert through.done, "a synchronize that could not complete (an event waiting on itself)"

    def _force(self, op, forced):
        for s in self.streams:
            if op in s.ops:
                for earlier in s.ops:
                    if id(earlier) not in forced:
                        forced.add(id(earlier))
                        for d in earlier.deps:
                            self._force(d, forced)
                    if earlier is op:
                        break

    def _queue(self, stream, run=lambda: None, deps=(), late=False, reads=()):
        op = _Op(self.clock + (self.lag if late else 0), tuple(deps), run, reads)
        stream.ops.append(op)
        self.run()
        return op

    def synchronize(self):
        """``torch.cuda.synchronize()``: everything queued runs."""
        for s in self.streams:
            if s.ops:
                self.run(through=s.ops[-1])

    # -- the backend loader() calls (_device.CudaBackend's methods) -----------------------------
    def available(self):
        return True

    def register(self, block):
        self.registered[block.data_ptr()] = block
        self.registrations += 1
        return True

    def unregister(self, block):
        lo, hi = block.data_ptr(), block.data_ptr() + block.numel()
        for s in self.streams:
            for op in s.ops:
                if any(lo <= ptr < hi for ptr, _ in op.reads):
                    self.violations.append("cudaHostUnregister of a block a queued copy still reads")
        # kept mapped: a copy still queued (a violation above) reads it later instead of crashing
        self.kept.append(self.registered.pop(block.data_ptr()))
        self.unregistrations += 1

    def pin(self, tensor):
        # torch's caching host allocator: fresh pinned memory, never reused while a copy reads it
        self.pins += 1
        return tensor.clone()

    def stream(self, device):
        s = LateStream(self, f"side {len(self.streams)}")
        self.streams.append(s)
        return s

    def copy(self, batch, device, stream):
        out = {k: self._copy(v, stream) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return out, self._event(stream)

    def wait(self, event, batch, device):
        self._queue(self.current, deps=(event.op,))

    def record(self, device):
        return self._event(self.current)

    # -- what the user does -------------------------------------------------------------------
    def to_device(self, batch):
        """``{k: v.to("cuda", non_blocking=True)}`` on the current stream."""
        return {k: self._copy(v, self.current) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def snapshot(self, batch):
        """A kernel on the current stream that clones the device batch when it runs (what the
        step sees); the clone is filled in by then, so read it after :meth:`synchronize`."""
        out = {k: _blank(v) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        pairs = [(out[k], v) for k, v in batch.items() if isinstance(v, torch.Tensor)]

        def run():
            for dst, src in pairs:
                for d, s in _pieces(dst, src):
                    d.copy_(s)
        self._queue(self.current, run)
        return out

    # -- internals ----------------------------------------------------------------------------
    def _event(self, stream):
        return LateEvent(stream, self._queue(stream))

    def _registered_block(self, t):
        ptr = t.data_ptr()
        for base, block in self.registered.items():
            if base <= ptr < base + block.numel():
                return block
        return None

    def _copy(self, src, stream):
        """A device tensor (a CPU tensor standing for it) that the copy fills when it runs."""
        dst = _blank(src)
        work = []
        for d, s in _pieces(dst, src):
            nbytes = s.numel() * s.element_size()
            if self._registered_block(s) is not None and nbytes:
                assert s.is_contiguous(), "a pinned batch tensor that is not contiguous"
                work.append((d, s.data_ptr(), nbytes))  # the address, not the tensor
            else:
                d.copy_(s)  # pageable (or torch-pinned, event-guarded): staged before the call returns
        if not work:
            return dst

        def run():
            for d, ptr, nbytes in work:
                ctypes.memmove(d.data_ptr(), ptr, nbytes)
            self.late_copies += 1
        self._queue(stream, run, late=True, reads=[(ptr, n) for _, ptr, n in work])
        return dst


def _blank(src):
    """Fresh memory shaped as ``src`` (a nested tensor: its values and offsets), filled with
    SENTINEL."""
    if src.is_nested:
        return torch.nested.nested_tensor_from_jagged(_blank(src.values()), _blank(src.offsets()))
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    out.view(-1).view(torch.uint8).fill_(SENTINEL)
    return out


def _pieces(dst, src):
    if src.is_nested:
        return [(dst.values(), src.values()), (dst.offsets(), src.offsets())]
    return [(dst, src)]
