"""dmacoll: ML collectives on GPU DMA (copy) engines, with a host emulator."""
from .errors import BackendUnavailable, DmaCollDeviceError, DmaCollError, DmaCollTimeoutError, InvalidArgument
from .options import Options

__version__ = "0.1.0"

__all__ = ["Communicator", "Options", "DmaCollError", "DmaCollTimeoutError", "DmaCollDeviceError", "InvalidArgument",
           "BackendUnavailable"]


def __getattr__(name):  # keep `import dmacoll` light: torch loads on first use
    if name == "Communicator":
        from .communicator import Communicator

        return Communicator
    raise AttributeError(name)
