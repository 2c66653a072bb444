"""Read one multi-channel TIFF as a (C, H, W) array, or say exactly why it cannot be used.

Every failure of one file is a :class:`BadImage` carrying the path and a short human reason, so
that the `prepare` report, the read-time warnings and the `fail` policy all speak the same language.
A compression this installation cannot decode is not a bad file but a missing prerequisite that
would lose every image saved the same way: it is a :class:`UserError` that stops the step.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import numpy as np
import tifffile

from training.errors import UserError

log = logging.getLogger(__name__)

ChannelAxis = Literal["auto", "first", "last"]
MIN_SIDE = 2
"""Images smaller than this on either side cannot be cropped or min-max scaled meaningfully."""


class BadImage(Exception):
    """An image that is corrupt, truncated, empty or of the wrong shape."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def to_channels_first(array: np.ndarray, channel_axis: ChannelAxis, path: str | Path) -> np.ndarray:
    """Return a (C, H, W) view; "auto" takes the smallest axis as channels (scDINO stores HWC)."""
    if array.ndim == 2:
        return array[None]
    if array.ndim != 3:
        raise BadImage(path, f"wrong shape {tuple(array.shape)}: expected (H, W), (H, W, C) or (C, H, W)")
    if channel_axis == "auto":
        smallest = int(np.argmin(array.shape))
        if smallest == 1:
            raise BadImage(path, f"wrong shape {tuple(array.shape)}: the smallest axis is in the middle; "
                                 "set data.channel_axis to first or last")
        channel_axis = "first" if smallest == 0 else "last"
    return array if channel_axis == "first" else np.moveaxis(array, -1, 0)


def check_pixels(image: np.ndarray, path: str | Path) -> None:
    """Reject arrays that would make min-max scaling meaningless or produce NaN."""
    _, height, width = image.shape
    if min(height, width) < MIN_SIDE or image.shape[0] < 1:
        raise BadImage(path, f"wrong shape {tuple(image.shape)} (C, H, W): too small")
    if image.dtype.kind not in "uif":
        raise BadImage(path, f"unsupported pixel type {image.dtype}")
    if image.dtype.kind == "f" and not np.isfinite(image).all():
        raise BadImage(path, "contains NaN or infinite values")
    flat = image.reshape(image.shape[0], -1)
    if (flat.max(axis=1) == flat.min(axis=1)).all():
        raise BadImage(path, "blank image: every channel is constant")


def read_image(path: str | Path, channel_axis: ChannelAxis = "auto") -> np.ndarray:
    """Read a TIFF into a (C, H, W) array of its own dtype (uint8/uint16/float), validated."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise BadImage(path, f"cannot be opened ({exc.strerror or exc})") from None
    if size == 0:
        raise BadImage(path, "empty file (0 bytes)")
    try:
        array = tifffile.imread(path)
    except Exception as exc:  # tifffile raises many types for damaged files; all mean "unreadable"
        missing = missing_codec(path, exc)
        if missing:
            raise UserError(missing) from None
        raise BadImage(path, f"corrupt or truncated TIFF ({type(exc).__name__}: {_first_line(exc)})") from None
    array = np.asarray(array)
    if array.size == 0:
        raise BadImage(path, "no image data (truncated TIFF)")
    image = to_channels_first(array, channel_axis, path)
    check_pixels(image, path)
    return np.ascontiguousarray(image)


def missing_codec(path: Path, exc: Exception) -> str | None:
    """A message if `path` failed to read because a codec is absent, else None (a damaged file).

    Without imagecodecs, tifffile raises ValueError("... requires the 'imagecodecs' package") for
    LZW, JPEG, the floating-point predictor and others, which would otherwise read as "corrupt"; an
    imagecodecs whose codec failed to load raises ImportError. The file's own compression and
    predictor tags are checked against tifffile's decoders, so the message names the scheme.
    """
    schemes = _schemes(path)
    missing = [name for name, decodable in schemes.items() if not decodable]
    if not missing and isinstance(exc, ImportError):
        used = [name for name in schemes if name != "NONE compression"] or ["compression"]
        missing = [f"{', '.join(used)} ({_first_line(exc)})"]
    if not missing:
        return None
    try:
        import imagecodecs
        fix = (f"the installed imagecodecs {imagecodecs.__version__} lacks it: reinstall the version "
               "pinned in requirements.txt, or save the images uncompressed")
    except ImportError:
        fix = "install imagecodecs (`pip install -r requirements.txt` installs the pinned version)"
    return f"{path}: cannot decode its {', '.join(missing)}: the codec is missing; {fix}"


def _schemes(path: Path) -> dict[str, bool]:
    """The known compressions and predictors the file uses, each with whether tifffile can decode it.

    Empty when the header itself cannot be read (a damaged file, not a missing codec).
    """
    found: dict[str, bool] = {}
    try:
        with tifffile.TiffFile(path) as tif:
            for page in tif.pages:
                compression, predictor = int(page.compression), int(page.predictor)
                if _known(tifffile.COMPRESSION, compression):
                    name = f"{tifffile.COMPRESSION(compression).name} compression"
                    found[name] = compression in tifffile.TIFF.DECOMPRESSORS
                if predictor != 1 and _known(tifffile.PREDICTOR, predictor):
                    name = f"{tifffile.PREDICTOR(predictor).name} predictor"
                    found[name] = predictor in tifffile.TIFF.UNPREDICTORS
    except Exception:  # tifffile raises many types for damaged headers
        return {}
    return found


def _known(enum: type, value: int) -> bool:
    """Whether a tag value names a scheme tifffile knows (a damaged tag may hold any number)."""
    try:
        enum(value)
    except ValueError:
        return False
    return True


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no details"
