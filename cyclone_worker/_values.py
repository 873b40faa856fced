"""The old private name of cyclone_worker.values, kept so that code written against it still imports."""

from .values import *  # noqa: F401,F403
from .values import __all__  # noqa: F401
