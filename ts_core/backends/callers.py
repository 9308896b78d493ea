"""Who made an API call: the user's program, or the framework's own machinery.

torch.distributed's Python code calls tensor APIs inside its hooks: FSDP2 unpacks all-gathered
parameters with ``narrow``/``split``/``view`` of buffers that are not yet filled (recording them
reads uninitialised memory, a false NaN), reduce-scatters gradients with ``div_``/``cat``, and
DTensor redistributes with ``view_as``. Those calls are not the user's program: they are run,
not recorded. What they produced shows in the records of the user's calls around them.

torch's optimizers and gradient clipping are machinery of the same kind, and their calls
depend on the device: ``AdamW`` runs 9 tensor methods per parameter on CPU (its for-loop
implementation) but ``torch._foreach_*`` kernels on CUDA (its default there) or one fused
kernel (``fused=True``); ``clip_grad_norm_`` likewise. Recorded, a CPU dump of a step held
468 more calls than the CUDA dump of the same program (GPT-2 4x256, 52 parameters). Their
effect shows in the parameter gradients and in the next step's parameters.

The caller is the first frame outside the tool itself (and outside torch.compile's frame-
evaluation wrappers); each code object is classified once, so a call costs one frame step and
a dict lookup.
"""
from __future__ import annotations

import os
import sys
from types import CodeType, FrameType
from typing import Dict, List, Optional, Sequence

_TOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
USER, INTERNAL, TRANSPARENT = 0, 1, 2


def _prefix(path: str) -> str:
    """A folder matches the files under it; a ``.py`` file matches itself."""
    return path if path.endswith(".py") else path.rstrip(os.sep) + os.sep


class CallerFilter:
    """Tells calls made directly from `internal_dirs` (framework machinery: folders, or ``.py``
    files) from the user's; frames of the tool and of `transparent_dirs` (wrappers between the
    two) are looked through."""

    def __init__(self, internal_dirs: Sequence[str], transparent_dirs: Sequence[str] = ()):
        self._internal = tuple(_prefix(d) for d in internal_dirs)
        self._transparent = (_TOOL_DIR,) + tuple(d.rstrip(os.sep) + os.sep for d in transparent_dirs)
        # id(code) -> kind: an int key hashes in no time, a code object's hash is recomputed
        # on every lookup (0.06-0.33 us for a transformers forward); _codes keeps each code
        # object alive, so its id is never reused for another
        self._kinds: Dict[int, int] = {}
        self._codes: List[CodeType] = []

    def _kind(self, code: CodeType) -> int:
        name = code.co_filename
        kind = TRANSPARENT if name.startswith(self._transparent) else \
            INTERNAL if name.startswith(self._internal) else USER
        self._codes.append(code)
        self._kinds[id(code)] = kind
        return kind

    def internal_call(self) -> bool:
        """Was the API whose wrapper is running (the tool's frames up the stack from here) called
        by framework machinery?"""
        frame: Optional[FrameType] = sys._getframe(1)
        kinds = self._kinds
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(id(code))
            if kind is None:
                kind = self._kind(code)
            if kind != TRANSPARENT:
                return kind == INTERNAL
            frame = frame.f_back
        return False
