"""``from hyper_parallel.core.multicore import MegaMoeExperts`` — re-exports megamoe."""
from megamoe import *  # noqa: F401,F403
from megamoe import __version__  # noqa: F401
