"""Errors raised by dmacoll."""


class DmaCollError(RuntimeError):
    """Base class of dmacoll's errors."""


class InvalidArgument(DmaCollError, ValueError):
    """A call was rejected before any device work: the message says what to change."""


class DmaCollTimeoutError(DmaCollError, TimeoutError):
    """A peer never signalled within the communicator's timeout."""


class BackendUnavailable(DmaCollError):
    """The requested backend cannot run on this machine."""


class DmaCollDeviceError(DmaCollError):
    """The GPU reported an error (a faulting copy or kernel) while a call was in flight: sticky, the process's GPU
    work cannot go on."""
