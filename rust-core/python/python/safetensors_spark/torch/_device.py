"""``loader(..., pin_memory=True, device="cuda")``: batches in page-locked (pinned) memory that is
pooled and reused, and copied to the GPU one batch ahead on a side stream (spec/python.md §3.3).

Pinning: the pooled shared-memory blocks the workers write messages into (``_handoff.BlockPool``)
are mapped by the training process for the iterator's life, so each is registered as pinned memory
once (``cudaHostRegister``) when its first message arrives, and its batches, views of it, are
pinned with no copy; the blocks are unregistered when the iterator ends. A pinned block goes back
to its worker only after an event on the current stream, recorded once its tensors are gone, has
completed: a non-blocking copy from it may still be queued (``_handoff.Releases``). A batch that is not in a
pooled block (no workers, one batch per message, a full pool) is copied into torch's own pinned
memory (``Tensor.pin_memory``, torch's caching host allocator).

The device copy: batch ``i + 1`` is copied (``non_blocking``) on a side stream before batch ``i``
is handed out; the consumer's stream waits on the copy's event, so the copy overlaps the previous
step; the host batch (its pooled block) is kept until that event has completed, then dropped,
which lets the worker reuse the block.

Every CUDA call goes through :data:`BACKEND` (``CudaBackend``); the package's tests, which run
without a GPU, put stand-ins there: a recording one, and one whose copies complete late
(tests/python/package/late_cuda.py)."""

import collections
import warnings

import torch


class CudaBackend:
    """The CUDA calls of pinning and of the device copy."""

    def available(self):
        return torch.cuda.is_available()

    def register(self, block):
        """Registers the memory of a uint8 tensor as pinned; False when CUDA refuses."""
        try:  # torch.cuda.cudart() itself inside: a torch without the binding also falls back
            cudart = torch.cuda.cudart()
            torch.cuda.check_error(cudart.cudaHostRegister(block.data_ptr(), block.numel(), 0))
        except Exception as e:  # noqa: BLE001 - any refusal: its batches are copied instead
            warnings.warn(f"loader(pin_memory=True): cudaHostRegister of a {block.numel()}-byte block failed "
                          f"({e}); its batches are copied into pinned memory instead")
            return False
        return True

    def unregister(self, block):
        torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(block.data_ptr()))

    def pin(self, tensor):
        return tensor.pin_memory()

    def stream(self, device):
        return torch.cuda.Stream(device)

    def record(self, device):
        """An event recorded on the current stream of ``device`` (None: the current device):
        it completes once every copy queued on that stream before it has."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event

    def copy(self, batch, device, stream):
        """The batch's tensors copied to ``device`` on ``stream`` (non-blocking) and an event
        recorded after them."""
        with torch.cuda.stream(stream):
            out = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                   for k, v in batch.items()}
            event = torch.cuda.Event()
            event.record(stream)
        return out, event

    def wait(self, event, batch, device):
        """The current stream waits for the copy; the copies' memory (allocated on the side
        stream) is marked as used by it, so the allocator does not reuse it early."""
        current = torch.cuda.current_stream(device)
        current.wait_event(event)
        for v in batch.values():
            if isinstance(v, torch.Tensor):
                for t in ((v.values(), v.offsets()) if v.is_nested else (v,)):
                    t.record_stream(current)


#: The backend of every pinned or device loader iterator (tests replace it).
BACKEND = CudaBackend()


def resolve_device(device, pin_memory):
    """``(torch.device or None, pin)`` for loader()'s arguments; ``device`` other than a CUDA
    device, or CUDA absent, is a ``ValueError`` saying what is allowed. Pinning without CUDA is
    dropped with torch's own warning text (as torch's DataLoader does)."""
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"loader(): device={device!r} is not a torch device ({e}); use device='cuda' or "
                             f"'cuda:N', or leave it None") from None
        if dev.type == "cpu":
            dev = None
        elif dev.type != "cuda":
            raise ValueError(f"loader(): device={device!r}: only CUDA devices are supported ('cuda', 'cuda:N'); "
                             f"leave it None and move batches yourself")
        elif not BACKEND.available():
            raise ValueError(f"loader(): device={device!r} needs torch with CUDA and a visible GPU, and "
                             f"torch.cuda.is_available() is False here (torch {torch.__version__}); leave "
                             f"device None on a machine without a GPU")
        device = dev
    pin = bool(pin_memory) or device is not None
    if pin and not BACKEND.available():
        warnings.warn("loader(): pin_memory=True but no CUDA device is available: batches are not pinned "
                      "(as torch's DataLoader does)")
        pin = False
    return device, pin


class Delivery:
    """One iterator's pinning and device copy (a new one per iterator: its registered blocks)."""

    def __init__(self, device, backend=None):
        self.backend = backend or BACKEND
        self.device = device
        self.registered = {}  # (worker, slot) of a pooled block -> (block, registered or not)

    def block(self, key, block):
        """A pooled block's first arrival: registered as pinned, kept until :meth:`close`."""
        if key not in self.registered:
            self.registered[key] = (block, self.backend.register(block))

    def fence(self):
        """An event after every copy queued so far on the current stream (``Releases``)."""
        return self.backend.record(self.device)

    def pinned(self, key):
        entry = self.registered.get(key)
        return entry is not None and entry[1]

    def pin_batch(self, batch):
        """A batch outside a registered block, copied into pinned memory."""
        return {k: self.backend.pin(v) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def deliver(self, batches):
        """The batches on the device, each copied one batch ahead of the one handed out."""
        be, dev = self.backend, self.device
        stream = be.stream(dev)
        copying = collections.deque()  # (event, host batch) of copies that may still run
        ahead = None
        try:
            for host in batches:
                out, event = be.copy(host, dev, stream)
                if ahead is not None:
                    yield self._ready(ahead, copying)
                ahead = (event, host, out)
                del host, out, event
            if ahead is not None:
                yield self._ready(ahead, copying)
                ahead = None
        finally:
            for event, _ in copying:
                event.synchronize()
            copying.clear()
            if ahead is not None:
                ahead[0].synchronize()

    def _ready(self, ahead, copying):
        event, host, out = ahead
        self.backend.wait(event, out, self.device)
        copying.append((event, host))
        while copying and copying[0][0].query():
            copying.popleft()  # its copy is done: the host batch (and its block) may go
        return out

    def close(self):
        """Unregisters the blocks registered by this iterator (after the last device copy)."""
        for block, ok in self.registered.values():
            if ok:
                self.backend.unregister(block)
        self.registered.clear()
