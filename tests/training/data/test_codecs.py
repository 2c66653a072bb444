"""Compressed TIFFs (LZW as Fiji and Bio-Formats write it, deflate, packbits, zstd, lzma) read
pixel-exact, through `read_image` and through `prepare`; a codec that is not installed stops the
step with a message naming the codec and the fix, instead of dropping every image as "corrupt"."""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile

from tests.support.tiny import run_cli
from training.data.store.read import PackedImages
from training.data.tiff import BadImage, read_image
from training.errors import UserError
from training.rundir import RunLayout

COMPRESSIONS = ["lzw", "zlib", "deflate", "packbits", "zstd", "lzma"]
TIFFFILE = importlib.import_module("tifffile.tifffile")


def source_image(dtype: str, seed: int = 0) -> np.ndarray:
    """A 5-channel (H, W, C) image, channels last as scDINO's data, with the full range of its type."""
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.normal(100.0, 30.0, (40, 36, 5)).astype(np.float32)
    return rng.integers(0, np.iinfo(dtype).max, (40, 36, 5), dtype=dtype, endpoint=True)


def write(path: Path, image: np.ndarray, compression: str, predictor: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tifffile.imwrite(path, image, photometric="minisblack", planarconfig="contig",
                     compression=compression, predictor=predictor)
    return path



@pytest.mark.parametrize("predictor", [False, True], ids=["plain", "predictor"])
@pytest.mark.parametrize("dtype", ["uint16", "float32"])
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_read_image_is_pixel_exact(tmp_path, compression, dtype, predictor):
    image = source_image(dtype)
    path = write(tmp_path / "a.tif", image, compression, predictor)
    with tifffile.TiffFile(path) as tif:
        assert tif.pages.first.compression.name.lower() in (compression, "adobe_deflate")
    read = read_image(path)
    assert read.dtype == image.dtype
    np.testing.assert_array_equal(read, np.moveaxis(image, -1, 0))


@pytest.mark.parametrize("dtype", ["uint16", "float32"])
def test_prepare_packs_every_compression_pixel_exact(make_config, tmp_path, dtype):
    root = tmp_path / "images"
    sources = {}
    for i, compression in enumerate(COMPRESSIONS):
        for predictor in (False, True):
            rel = f"{'ab'[i % 2]}/{compression}_{int(predictor)}.tif"
            sources[rel] = source_image(dtype, seed=10 * i + predictor)
            write(root / rel, sources[rel], compression, predictor)
    config = make_config({"data.source": str(root)})
    assert run_cli(config, "prepare") == 0
    layout = RunLayout.from_config(config)
    assert not layout.bad_images.exists()
    packed = PackedImages(layout.packed)
    assert sorted(packed.paths) == sorted(sources)
    for i, rel in enumerate(packed.paths):
        np.testing.assert_array_equal(packed.read(i), np.moveaxis(sources[rel], -1, 0))


@pytest.fixture
def without_imagecodecs(monkeypatch):
    """tifffile as where imagecodecs is not installed: only its own pure-Python fallback codecs."""
    monkeypatch.setitem(sys.modules, "imagecodecs", None)  # `import imagecodecs` raises ImportError
    monkeypatch.setattr(TIFFFILE, "imagecodecs", importlib.import_module("tifffile._imagecodecs"))
    fresh_codec_tables(monkeypatch)


def fresh_codec_tables(monkeypatch):
    """tifffile caches decoders once resolved; give it empty tables for this test only."""
    monkeypatch.setitem(vars(TIFFFILE.TIFF), "DECOMPRESSORS", TIFFFILE.CompressionCodec(encode=False))
    monkeypatch.setitem(vars(TIFFFILE.TIFF), "UNPREDICTORS", TIFFFILE.PredictorCodec(encode=False))


def test_missing_codec_is_a_clear_error_not_a_bad_image(tmp_path, without_imagecodecs):
    lzw = write(tmp_path / "lzw.tif", source_image("uint16"), "lzw")
    with pytest.raises(UserError) as error:
        read_image(lzw)
    message = str(error.value)
    assert not isinstance(error.value, BadImage) and "\n" not in message
    assert "lzw.tif" in message and "LZW compression" in message and "corrupt" not in message
    assert "install imagecodecs" in message and "requirements.txt" in message
    float_lzw = write(tmp_path / "float.tif", source_image("float32"), "lzw", predictor=True)
    with pytest.raises(UserError, match="LZW compression, FLOATINGPOINT predictor"):
        read_image(float_lzw)


def test_codecs_tifffile_has_without_imagecodecs_still_read(tmp_path, without_imagecodecs):
    image = source_image("uint16")
    path = write(tmp_path / "zlib.tif", image, "zlib", predictor=True)
    np.testing.assert_array_equal(read_image(path), np.moveaxis(image, -1, 0))


def test_a_codec_that_failed_to_load_is_named(tmp_path, monkeypatch):
    """imagecodecs installed, but one of its codecs cannot load: it raises ImportError when called."""
    import imagecodecs

    def unavailable(*args, **kwargs):
        raise ImportError("could not import name 'lzw_decode' from 'imagecodecs'")

    monkeypatch.setattr(imagecodecs, "lzw_decode", unavailable)
    fresh_codec_tables(monkeypatch)
    path = write(tmp_path / "lzw.tif", source_image("uint16"), "lzw")
    with pytest.raises(UserError, match=f"LZW compression.*imagecodecs {imagecodecs.__version__} lacks it"):
        read_image(path)


def test_missing_codec_stops_prepare_even_when_skipping_bad_images(make_config, tmp_path, without_imagecodecs, capsys):
    root = tmp_path / "images"
    write(root / "a" / "zlib.tif", source_image("uint16", 1), "zlib")
    write(root / "a" / "lzw.tif", source_image("uint16", 2), "lzw")
    config = make_config({"data.source": str(root), "data.on_bad_image": "skip"})
    assert run_cli(config, "prepare") == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "lzw.tif" in message and "LZW compression" in message and "imagecodecs" in message
    assert not RunLayout.from_config(config).packed.exists()


def test_damaged_file_is_still_a_bad_image(tmp_path):
    path = write(tmp_path / "cut.tif", source_image("uint16"), "lzw")
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(BadImage):
        read_image(path)
