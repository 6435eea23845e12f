"""Reading the coordinate pickles other projects write, without running their code.

A ``.pkl`` file is a program: ``pickle.load`` calls whatever constructors it names, so a
crafted file runs any code. :func:`load_numbers` reads one with an unpickler that
builds only lists, tuples, ints and floats (numpy integer and float scalars included,
as LiveTalking's ``coords.pkl`` holds them) and refuses every other name it meets.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from inference_core.importers.errors import ImportFailedError

# The only globals a numbers pickle needs: numpy's scalar reconstructor and dtype.
_NUMPY_SCALAR = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}
_NUMPY_DTYPE = {("numpy", "dtype")}
_NUMERIC_KINDS = "iuf"


def _dtype(name: object, *args: object) -> np.dtype[Any]:
    dtype: np.dtype[Any] = np.dtype(name)  # type: ignore[call-overload]
    if dtype.kind not in _NUMERIC_KINDS:
        raise pickle.UnpicklingError(f"numpy dtype {dtype} is not an integer or float type")
    return dtype


def _scalar(dtype: object, data: object = b"") -> int | float:
    if not isinstance(dtype, np.dtype) or dtype.kind not in _NUMERIC_KINDS:
        raise pickle.UnpicklingError("numpy scalar of a type that is not a number")
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise pickle.UnpicklingError("numpy scalar with malformed data")
    value = np.frombuffer(data, dtype=dtype)[0]
    return int(value) if dtype.kind in "iu" else float(value)


class _NumbersUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY_SCALAR:
            return _scalar
        if (module, name) in _NUMPY_DTYPE:
            return _dtype
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


def load_numbers(path: Path) -> Any:
    """The lists/tuples of numbers pickled in ``path``; anything else is refused.

    Raises :class:`ImportFailedError` naming the file and what was found in it.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImportFailedError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    try:
        value = _NumbersUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ImportFailedError(
            f"{path}: not a pickle of plain numbers ({exc}); lipstream only reads lists and "
            "tuples of numbers from .pkl files and never runs code from them. Re-create the "
            "file with the tool that made it, or write the rects as JSON"
        ) from exc
    _check_numbers(path, value)
    return value


def _check_numbers(path: Path, value: object) -> None:
    if isinstance(value, list | tuple):
        for item in value:
            _check_numbers(path, item)
    elif not isinstance(value, int | float) or isinstance(value, bool):
        raise ImportFailedError(
            f"{path}: holds a {type(value).__name__}; only lists and tuples of numbers are read"
        )
