import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Without an NVIDIA GPU the Triton kernels run in Triton's interpreter (numpy on the CPU); it
# must be chosen before the kernels are defined.
if not Path("/dev/nvidia0").exists():
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")
