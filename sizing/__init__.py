"""kvsize's analytic core: KV cache formats, model shapes, engine rules and capacity.

Pure Python: no torch, streamlit or plotly. Import the submodules you need; this package
imports nothing heavy at start-up.
"""

__version__ = "0.1.0"
