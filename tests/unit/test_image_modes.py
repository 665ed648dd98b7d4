"""Every image mode PIL opens decodes to the pixels a viewer shows, in memory and from files."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedapp.data.arrays import ALPHA_BACKGROUND, pil_to_rgb_array
from fedapp.data.imagefolder import load_imagefolder

RED, GREY = (255, 0, 0), (128, 128, 128)


def solid(mode: str, value) -> Image.Image:
    return Image.new(mode, (4, 4), value)


def grey_array(dtype, value) -> Image.Image:
    return Image.fromarray(np.full((4, 4), value, dtype=dtype))


# (what, image, the RGB a viewer shows)
CASES = [
    ("RGB", solid("RGB", RED), RED),
    ("RGBX", solid("RGBX", (*RED, 0)), RED),
    ("L", solid("L", 128), GREY),
    ("1 (bilevel)", solid("1", 1), (255, 255, 255)),
    ("P (palette)", solid("RGB", RED).convert("P"), RED),
    ("CMYK", solid("CMYK", (0, 255, 255, 0)), RED),
    ("YCbCr", solid("YCbCr", (76, 85, 255)), RED),
    ("HSV", solid("HSV", (0, 255, 255)), RED),
    ("LAB black (PIL copies the channels)", solid("LAB", (0, 128, 128)), (0, 0, 0)),
    ("I;16 (16-bit grey; PIL clips it white)", grey_array(np.uint16, 32896), GREY),
    ("I (32-bit grey holding 16-bit data)", grey_array(np.int32, 32896), GREY),
    ("I (32-bit grey holding 8-bit data)", grey_array(np.int32, 128), GREY),
    ("F in 0..1 (PIL makes it black)", grey_array(np.float32, 128 / 255), GREY),
    ("F in 0..255", grey_array(np.float32, 128.0), GREY),
    ("RGBA opaque", solid("RGBA", (*RED, 255)), RED),
    ("RGBA transparent (hidden colour must not show)", solid("RGBA", (0, 0, 0, 0)), ALPHA_BACKGROUND),
    ("RGBA half transparent", solid("RGBA", (0, 0, 0, 128)), (127, 127, 127)),
    ("LA transparent", solid("LA", (0, 0)), ALPHA_BACKGROUND),
    ("La (premultiplied; PIL cannot convert it)", solid("La", (64, 128)), (191, 191, 191)),
    ("RGBa premultiplied opaque", solid("RGBa", (*RED, 255)), RED),
]


@pytest.mark.parametrize(("what", "image", "expected"), CASES, ids=[c[0] for c in CASES])
def test_every_mode_decodes_to_what_a_viewer_shows(what, image, expected):
    pixels = pil_to_rgb_array(image, 4)
    assert pixels.shape == (4, 4, 3) and pixels.dtype == np.uint8
    assert np.abs(pixels.astype(int) - np.array(expected)).max() <= 4, f"{what}: {pixels[0, 0]} != {expected}"


def test_palette_with_a_transparent_colour_shows_the_background():
    image = solid("P", 0)
    image.putpalette([0, 0, 0] * 256)
    image.info["transparency"] = 0
    assert (pil_to_rgb_array(image, 4) == ALPHA_BACKGROUND).all()


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (4, 2), (0, 0, 0))
    image.paste(RED, (0, 0, 2, 2))  # red on the left half as stored
    exif = Image.Exif()
    exif[0x0112] = 3  # rotated 180 degrees: red shows on the right
    image.info["exif"] = exif.tobytes()
    image.getexif()[0x0112] = 3
    pixels = pil_to_rgb_array(image, 4)
    assert tuple(pixels[1, 3]) == RED and tuple(pixels[1, 0]) == (0, 0, 0)


def test_files_of_every_kind_decode_from_an_imagefolder(tmp_path):
    """Through the data layer as a run loads it: 16-bit PNG, float TIFF, RGBA PNG, palette GIF, CMYK JPEG."""
    files = {
        "grey16.png": grey_array(np.uint16, 32896),
        "float.tiff": grey_array(np.float32, 128 / 255),
        "alpha.png": solid("RGBA", (0, 0, 0, 0)),
        "palette.gif": solid("RGB", GREY).convert("P", palette=Image.Palette.ADAPTIVE),
        "cmyk.jpg": solid("CMYK", (0, 0, 0, 127)),
    }
    (tmp_path / "grey").mkdir()
    (tmp_path / "other").mkdir()
    for name, image in files.items():
        image.save(tmp_path / "grey" / name)
    solid("RGB", RED).save(tmp_path / "other" / "red.png")
    data = load_imagefolder(str(tmp_path), image_size=4, cache_dir=str(tmp_path / "cache"))
    greys = data.images[data.labels == 0].astype(int)
    backgrounds = np.array([ALPHA_BACKGROUND]).reshape(1, 1, 1, 3)
    assert len(greys) == len(files)
    # alpha.png is the transparent one; every other file is mid grey.
    is_background = (np.abs(greys - backgrounds) <= 4).all(axis=(1, 2, 3))
    assert is_background.sum() == 1
    assert (np.abs(greys[~is_background] - 128) <= 4).all()
