"""``python -m samplechain.runtime.build``: compile the CPU engine and the sampler chain's fused step for this machine
now (``make setup`` runs it), so that the first model load and the first token need not.

A module of its own: the package imports ``cpu_engine``, so running that module as ``__main__`` would load it a
second time (and Python warns so).
"""

from __future__ import annotations

import sys

from samplechain import _native
from samplechain.runtime.cpu_engine import EngineUnavailable, build, supported_isas


def main() -> int:
    """Build (or find) the engine and say where it is; without a C compiler, say what the runtime uses instead."""
    try:
        print(f"CPU engine: {build()} ({', '.join(supported_isas())})")
    except EngineUnavailable as e:
        print(f"CPU engine not built: {e}; the runtime will use torch's kernels", file=sys.stderr)
    step = _native.sampling()
    print(f"sampler chain: {'the compiled fused step' if step is not None else 'NumPy only'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
