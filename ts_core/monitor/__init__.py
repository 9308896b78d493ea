"""Monitor mode: always-on, cheap monitoring of every training step and automatic capture of the
steps around an anomaly (NaN/Inf, loss or gradient-norm spike) as ordinary dumps.

Enabled by the config's ``monitor`` section (options.py); driven by the debugger (monitor.py);
the hooks live with the backends (backends/monitor_tap.py). Importing this package needs only
numpy and pyyaml.
"""
from .monitor import Monitor
from .options import MonitorConfig, SpikeConfig, parse_monitor
from .spike import SpikeDetector

__all__ = ["Monitor", "MonitorConfig", "SpikeConfig", "parse_monitor", "SpikeDetector"]
