"""Every engine has every member of the engine protocol (backends/engine.py) that the communicator uses."""
import inspect
import re

from dmacoll.backends.cuda import CudaEngine
from dmacoll.backends.engine import Engine
from dmacoll.backends.hip import HipEngine
from dmacoll.backends.host import HostEngine
from dmacoll_lab.verify.launch import run_ranks

MEMBERS = [n for n in dir(Engine) if not n.startswith("_")] + list(Engine.__annotations__)


def _host_engine_is_an_engine(rank, world):
    from dmacoll import Communicator

    comm = Communicator(backend="host", timeout_s=10)
    ok = isinstance(comm.engine, Engine)
    comm.close()
    return ok


def test_the_host_engine_instance_has_every_member():
    assert run_ranks(_host_engine_is_an_engine, 2) == [True, True]


def test_the_gpu_engines_define_every_member():
    """No GPU here: every member is a class attribute or method, or an attribute the class (or its base) sets."""
    for cls in (CudaEngine, HipEngine, HostEngine):
        source = "".join(inspect.getsource(c) for c in cls.__mro__ if c.__module__.startswith("dmacoll"))
        missing = [m for m in set(MEMBERS) if not hasattr(cls, m) and not re.search(rf"\beng\.{m}\b|\bself\.{m}\b", source)]
        assert not missing, (cls.__name__, missing)
