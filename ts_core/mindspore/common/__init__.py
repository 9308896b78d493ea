"""msprobe.mindspore.common's place (``from ts_core.mindspore.common.utils import MsprobeStep``)."""
