"""BMP to PNG, as pi's read converts an image the model cannot take into one it can.

The bytes come from the agent's container, so this runs no image library over them: it understands only the common
uncompressed BMPs (8-bit paletted, 24-bit, 32-bit plain or with byte-aligned bit fields), checks every size in the
headers against the bytes actually there and against MAX_PIXELS before allocating anything, and refuses the rest
with a message for the model. Work and memory are then linear in a file the caller has already bounded.
"""
from __future__ import annotations

import struct
import zlib
from typing import Callable

MAX_SIDE = 16384
MAX_PIXELS = 16 * 1024 * 1024

_FILE_HEADER = 14
_INFO_HEADERS = (40, 52, 56, 108, 124)   # BITMAPINFOHEADER and its V2, V3, V4, V5 extensions
_BI_RGB, _BI_BITFIELDS, _BI_ALPHABITFIELDS = 0, 3, 6


class BmpError(ValueError):
    """A BMP this converter will not read; the message says why, for the model."""


def looks_like_bmp(head: bytes) -> bool:
    """"BM" and a known info header size: a text file that happens to start with "BM" stays text."""
    return (len(head) >= _FILE_HEADER + 4 and head[:2] == b"BM"
            and struct.unpack_from("<I", head, _FILE_HEADER)[0] in (12, *_INFO_HEADERS))


class PngTooLarge(BmpError):
    """The PNG would be larger than the caller takes: found while compressing, which then stops."""


def bmp_to_png(data: bytes, max_png: int | None = None) -> bytes:
    """The PNG of an uncompressed BMP (RGB, or RGBA when its bit fields carry an alpha not all 0); else BmpError.
    Rows are compressed as they are converted, so no uncompressed copy of the image is ever held, and a PNG growing
    past `max_png` bytes stops the work there (PngTooLarge)."""
    if len(data) < _FILE_HEADER + 40:
        raise BmpError("the file is too short for a BMP header")
    pixel_offset = struct.unpack_from("<I", data, 10)[0]
    header_size, width, height, planes, bpp, compression = struct.unpack_from("<IiiHHI", data, _FILE_HEADER)
    if header_size not in _INFO_HEADERS:
        raise BmpError(f"its header ({header_size} bytes) is an old or unknown BMP variant")
    top_down = height < 0
    height = abs(height)
    if width <= 0 or height == 0 or planes != 1:
        raise BmpError(f"its header is invalid (width {width}, height {height}, planes {planes})")
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        raise BmpError(f"it is {width}x{height}, over the {MAX_SIDE}x{MAX_SIDE} and {MAX_PIXELS} pixel limits")
    if compression not in (_BI_RGB, _BI_BITFIELDS, _BI_ALPHABITFIELDS):
        raise BmpError(f"it is compressed (method {compression}); only uncompressed BMPs are converted")
    if bpp not in (8, 24, 32) or (compression != _BI_RGB and bpp != 32) or (bpp == 8 and compression != _BI_RGB):
        raise BmpError(f"it has {bpp} bits per pixel with compression method {compression}; only 8-bit paletted, "
                       f"24-bit and 32-bit BMPs are converted")
    stride = (width * bpp + 31) // 32 * 4
    if pixel_offset < _FILE_HEADER + header_size or pixel_offset + stride * height > len(data):
        raise BmpError("its pixel data is cut short or lies outside the file")

    starts = [pixel_offset + y * stride for y in (range(height) if top_down else range(height - 1, -1, -1))]
    convert_row, channels = _row_converter(data, header_size, width, bpp, compression, starts)
    packer = zlib.compressobj(6)
    idat = bytearray()

    def add(compressed: bytes) -> None:
        idat.extend(compressed)
        if max_png is not None and len(idat) > max_png:
            raise PngTooLarge(f"as PNG it is over {max_png} bytes")
    for at in starts:
        add(packer.compress(b"\0" + convert_row(data[at:at + stride])))   # PNG filter type 0 (none)
    add(packer.flush())   # (zlib holds some back until the end)
    return _png(width, height, 6 if channels == 4 else 2, bytes(idat))


def _row_converter(data: bytes, header_size: int, width: int, bpp: int, compression: int,
                   starts: list[int]) -> tuple[Callable[[bytes], bytes], int]:
    """(a function from one BMP row to PNG pixel bytes, channels per pixel). `starts`: where each row begins."""
    if bpp == 8:
        colors = struct.unpack_from("<I", data, _FILE_HEADER + 32)[0] or 256
        table_at = _FILE_HEADER + header_size
        if colors > 256 or table_at + 4 * colors > len(data):
            raise BmpError("its colour table is invalid or cut short")
        palette = data[table_at:table_at + 4 * colors] + bytes(4 * (256 - colors))
        tables = [bytes(palette[i * 4 + c] for i in range(256)) for c in (2, 1, 0)]   # BGRx entries

        def paletted(row: bytes) -> bytes:
            index = row[:width]
            out = bytearray(3 * width)
            for c in range(3):
                out[c::3] = index.translate(tables[c])
            return bytes(out)
        return paletted, 3

    size = 3 if bpp == 24 else 4
    # Byte positions of R, G, B (and A) within a pixel: BGR(x) unless bit fields say otherwise.
    order = [2, 1, 0]
    if compression != _BI_RGB:
        masks_at = _FILE_HEADER + 40   # after the 40-byte part: in the larger headers, or just after the smallest
        count = 4 if header_size >= 56 or compression == _BI_ALPHABITFIELDS else 3
        if masks_at + 4 * count > len(data):
            raise BmpError("its colour masks are cut short")
        masks = struct.unpack_from(f"<{count}I", data, masks_at)
        order = [_byte_of(mask) for mask in masks[:3]]
        if count == 4 and masks[3]:
            alpha = _byte_of(masks[3])
            # Many writers fill an alpha they do not use with 0: all transparent, it is no alpha (as browsers read it).
            if any(data[at + alpha:at + size * width:size].strip(b"\0") for at in starts):
                order.append(alpha)

    channels = len(order)

    def direct(row: bytes) -> bytes:
        pixels = row[:size * width]
        out = bytearray(channels * width)
        for c, at in enumerate(order):
            out[c::channels] = pixels[at::size]
        return bytes(out)
    return direct, channels


def _byte_of(mask: int) -> int:
    for byte in range(4):
        if mask == 0xFF << (8 * byte):
            return byte
    raise BmpError(f"its colour mask {mask:#010x} is not one whole byte; such BMPs are not converted")


def _png(width: int, height: int, color_type: int, idat: bytes) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))
