"""read through the registry, against the in-memory sandbox and a real container (see tests/tool_sandbox.py)."""
from __future__ import annotations

import base64
import random
import threading
import zlib
import struct

import pytest

from pid.messages import ImageContent, TextContent
from pid.tools import read as read_module
from pid.tools.bmp import PngTooLarge, bmp_to_png
from pid.tools.paths import EMPTY_PATH
from pid.sandbox.config import AGENT_HOME
from tests.tool_sandbox import call_tool, put


def text(result) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


def read(box, **args):
    return call_tool(box, "read", args)


def png_bytes() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
            + chunk(b"IEND", b""))


def test_small_file_whole(sandbox):
    put(sandbox, "a.txt", "one\ntwo\n")
    result = read(sandbox, path="a.txt")
    assert not result.is_error and text(result) == "one\ntwo\n"  # exactly the file, final newline included
    assert result.details is None
    assert text(read(sandbox, path="@a.txt")) == "one\ntwo\n"
    assert text(read(sandbox, path=f"{sandbox.workdir}/./a.txt")) == "one\ntwo\n"


def test_line_cap(sandbox):
    lines = [f"line {i}" for i in range(1, 2501)]
    put(sandbox, "long.txt", "\n".join(lines) + "\n")
    # pi 0.8x: the final newline ends line 2500 and starts no 2501st.
    result = read(sandbox, path="long.txt")
    assert text(result) == (
        "\n".join(lines[:2000]) + "\n\n[Showing lines 1-2000 of 2500. Use offset=2001 to continue.]")
    assert result.details["truncation"] == {
        "truncated": True, "truncatedBy": "lines", "totalLines": 2500, "totalBytes": len("\n".join(lines)) + 1,
        "outputLines": 2000, "outputBytes": len("\n".join(lines[:2000])), "lastLinePartial": False,
        "firstLineExceedsLimit": False, "maxLines": 2000, "maxBytes": 51200}
    assert text(read(sandbox, path="long.txt", offset=2001)) == "\n".join(lines[2000:]) + "\n"


def test_byte_cap(sandbox):
    lines = [f"{i:04d}" + "x" * 206 for i in range(1, 501)]  # 210 bytes each
    put(sandbox, "wide.txt", "\n".join(lines) + "\n")
    # 242 lines = 242*210 + 241 separators = 51061 bytes; a 243rd would make 51272 > 51200.
    assert text(read(sandbox, path="wide.txt")) == (
        "\n".join(lines[:242]) + "\n\n[Showing lines 1-242 of 500 (50.0KB limit). Use offset=243 to continue.]")
    assert read(sandbox, path="wide.txt").details["truncation"]["truncatedBy"] == "bytes"


def test_offset_and_limit(sandbox):
    lines = [f"L{i}" for i in range(1, 101)]
    put(sandbox, "hundred.txt", "\n".join(lines) + "\n")
    assert text(read(sandbox, path="hundred.txt", offset=41, limit=20)) == (
        "\n".join(lines[40:60]) + "\n\n[40 more lines in file. Use offset=61 to continue.]")
    assert text(read(sandbox, path="hundred.txt", offset=91, limit=20)) == "\n".join(lines[90:]) + "\n"
    assert text(read(sandbox, path="hundred.txt", offset="99", limit="1")) == (
        "L99\n\n[1 more lines in file. Use offset=100 to continue.]")
    assert text(read(sandbox, path="hundred.txt", offset="100", limit="1")) == "L100\n"
    assert text(read(sandbox, path="hundred.txt", offset=101)) == (
        "Offset 101 is beyond end of file (100 lines total)")
    put(sandbox, "unterminated.txt", "\n".join(lines))   # no final newline: still 100 lines, and none added
    assert text(read(sandbox, path="unterminated.txt", offset=100)) == "L100"
    assert text(read(sandbox, path="unterminated.txt", offset=41, limit=20)) == (
        "\n".join(lines[40:60]) + "\n\n[40 more lines in file. Use offset=61 to continue.]")


def test_offset_beyond_end(sandbox):
    put(sandbox, "ten.txt", "".join(f"{i}\n" for i in range(10)))
    result = read(sandbox, path="ten.txt", offset=20)
    assert result.is_error and text(result) == "Offset 20 is beyond end of file (10 lines total)"


def test_long_first_line(sandbox):
    put(sandbox, "minified.js", "x" * 60000 + "\nshort\n")
    assert text(read(sandbox, path="minified.js")) == (
        "[Line 1 is 58.6KB, exceeds 50.0KB limit. Use bash: sed -n '1p' minified.js | head -c 51200]")
    assert read(sandbox, path="minified.js").details["truncation"]["firstLineExceedsLimit"] is True
    assert text(read(sandbox, path="minified.js", offset=2)) == "short\n"


def test_image_by_magic_bytes_not_extension(sandbox):
    data = png_bytes()
    put(sandbox, "picture.txt", data)
    result = read(sandbox, path="picture.txt")
    assert not result.is_error
    assert isinstance(result.content[0], TextContent) and result.content[0].text == "Read image file [image/png]"
    image = result.content[1]
    assert isinstance(image, ImageContent) and image.mime_type == "image/png"
    assert base64.b64decode(image.data) == data

    put(sandbox, "notes.png", "just text\n")
    result = read(sandbox, path="notes.png")
    assert [type(c) for c in result.content] == [TextContent] and text(result) == "just text\n"


def test_other_image_types(sandbox):
    for name, head, mime in [("j", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "image/jpeg"),
                             ("g", b"GIF89a\x01\x00\x01\x00", "image/gif"),
                             ("w", b"RIFF\x24\x00\x00\x00WEBPVP8 ", "image/webp")]:
        put(sandbox, name, head + b"\x00" * 32)
        assert text(read(sandbox, path=name)) == f"Read image file [{mime}]"


def test_binary_file_is_described_not_dumped(sandbox):
    put(sandbox, "prog", b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 8)
    result = read(sandbox, path="prog")
    assert result.is_error
    assert text(result) == ("Cannot display binary file prog (2.0KB, ELF executable). "
                            "Use bash to inspect it (e.g. file, xxd, strings).")
    put(sandbox, "latin1.txt", "caf\xe9 cr\xe8me\n".encode("latin-1"))
    assert "unknown binary data" in text(read(sandbox, path="latin1.txt"))


def test_utf8_character_cut_at_sniff_boundary_is_still_text(sandbox):
    body = "a" * (read_module.BINARY_SNIFF_BYTES - 1) + "é" + "\nend\n"
    put(sandbox, "edge.txt", body)
    assert text(read(sandbox, path="edge.txt")).endswith("é\nend\n")


def test_not_found_and_directory(sandbox):
    missing = read(sandbox, path="nope/missing.txt")
    assert missing.is_error and text(missing) == "File not found: nope/missing.txt"
    put(sandbox, "dir/file", "x")
    directory = read(sandbox, path="dir")
    assert directory.is_error and "is a directory" in text(directory) and "ls" in text(directory)
    empty = read(sandbox, path="")   # (its message used to name no path: " is a directory, …")
    assert empty.is_error and text(empty) == EMPTY_PATH


def test_empty_file(sandbox):
    put(sandbox, "empty", b"")
    result = read(sandbox, path="empty")
    assert not result.is_error and text(result) == ""   # pi 0.8x: an empty file has no lines
    assert text(read(sandbox, path="empty", offset=1)) == ""
    assert text(read(sandbox, path="empty", offset=2)) == "Offset 2 is beyond end of file (0 lines total)"
    put(sandbox, "blank", b"\n")   # one empty line
    assert text(read(sandbox, path="blank")) == "\n"
    assert text(read(sandbox, path="blank", offset=2)) == "Offset 2 is beyond end of file (1 lines total)"


class CountingSandbox:
    """Wraps a sandbox to record how much read_file was asked for and returned."""

    def __init__(self, inner):
        self.inner, self.workdir, self.reads = inner, inner.workdir, []

    def read_file(self, path, *, max_bytes=None, **kwargs):
        data = self.inner.read_file(path, max_bytes=max_bytes, **kwargs)
        self.reads.append((max_bytes, len(data)))
        return data

    def exec(self, *args, **kwargs):
        return self.inner.exec(*args, **kwargs)

    def write_file(self, path, data):
        return self.inner.write_file(path, data)


def test_huge_file_is_never_read_whole(docker_sandbox):   # files made by a real shell, read in parts by one
    box = CountingSandbox(docker_sandbox)
    result = box.exec("seq 1 2000000 > big.txt && wc -c < big.txt", timeout=60)
    size = int(result.tail)
    assert size > read_module.READ_CAP
    assert text(read(box, path="big.txt")) == (
        "\n".join(str(i) for i in range(1, 2001))
        + "\n\n[Showing lines 1-2000 of 2000000. Use offset=2001 to continue.]")
    assert text(read(box, path="big.txt", offset=1999990)) == (
        "\n".join(str(i) for i in range(1999990, 2000001)) + "\n")
    assert text(read(box, path="big.txt", offset=10, limit=5)) == (
        "10\n11\n12\n13\n14\n\n[1999986 more lines in file. Use offset=15 to continue.]")
    assert text(read(box, path="big.txt", offset=2000000, limit=5)) == "2000000\n"
    assert text(read(box, path="big.txt", offset=2000001)) == (
        "Offset 2000001 is beyond end of file (2000000 lines total)")
    assert box.reads and all(max_bytes == read_module.READ_CAP + 1 and n <= max_bytes for max_bytes, n in box.reads)


def test_huge_file_byte_cap_and_unterminated_last_line(docker_sandbox):
    sandbox = docker_sandbox
    sandbox.exec("yes \"$(printf 'y%.0s' $(seq 300))\" | head -n 40000 > wide.txt && printf tail >> wide.txt",
                 timeout=60)
    row = "y" * 300
    # 170 lines = 170*300 + 169 = 51169 bytes; 171 would be 51470.
    assert text(read(sandbox, path="wide.txt")) == (
        "\n".join([row] * 170) + "\n\n[Showing lines 1-170 of 40001 (50.0KB limit). Use offset=171 to continue.]")
    assert text(read(sandbox, path="wide.txt", offset=40000)) == row + "\ntail"


def test_huge_single_line(docker_sandbox):
    sandbox = docker_sandbox
    sandbox.exec("head -c 9000000 /dev/zero | tr '\\0' a > one.txt", timeout=60)
    assert text(read(sandbox, path="one.txt")) == (
        "[Line 1 is 8.6MB, exceeds 50.0KB limit. Use bash: sed -n '1p' one.txt | head -c 51200]")


def test_read_falls_back_to_macos_names(sandbox):
    """pi's read tries a narrow no-break space before AM/PM, NFD and a curly apostrophe when the name as written is
    missing."""
    put(sandbox, "Shot 2024-05-01 at 9.41.07\u202fPM.txt", "am-pm\n")
    assert text(read(sandbox, path="Shot 2024-05-01 at 9.41.07 PM.txt")) == "am-pm\n"
    put(sandbox, "Capture d\u2019e\u0301cran.txt", "curly+nfd\n")
    assert text(read(sandbox, path="Capture d'\u00e9cran.txt")) == "curly+nfd\n"
    put(sandbox, "it\u2019s.txt", "curly\n")
    assert text(read(sandbox, path="it's.txt")) == "curly\n"
    missing = read(sandbox, path="gone at 1.00.00 AM.txt")
    assert missing.is_error and text(missing) == "File not found: gone at 1.00.00 AM.txt"


def test_read_expands_home_and_honours_cancel(docker_sandbox):  # needs a real shell
    sandbox = docker_sandbox
    sandbox.write_file(f"{AGENT_HOME}/h.txt", b"home\n")
    assert text(read(sandbox, path="~/h.txt")) == "home\n"
    cancel = threading.Event()
    cancel.set()
    result = call_tool(sandbox, "read", {"path": "~/h.txt"}, cancel=cancel)
    assert result.is_error and text(result) == "Operation aborted"


def bmp_bytes(width: int, height: int, bpp: int = 24, *, top_down: bool = False, compression: int = 0,
              header: int = 40, masks: tuple[int, ...] = (), palette: bytes = b"", rows: bytes | None = None,
              colors_used: int = 0) -> bytes:
    """A BMP built field by field; pixel (x, y) is (x, y, x+y) in RGB unless `rows` gives the pixel data."""
    stride = (width * bpp + 31) // 32 * 4
    if rows is None:
        out = bytearray()
        for y in (range(height) if top_down else range(height - 1, -1, -1)):
            row = bytearray()
            for x in range(width):
                b, g, r = (x + y) & 0xFF, y & 0xFF, x & 0xFF
                row += bytes([b, g, r]) if bpp == 24 else bytes([b, g, r, 0x80])
            out += row + bytes(stride - len(row))
        rows = bytes(out)
    info = struct.pack("<IiiHHIIiiII", header, width, -height if top_down else height, 1, bpp, compression,
                       len(rows), 2835, 2835, colors_used, 0)
    info += struct.pack(f"<{len(masks)}I", *masks)
    info += bytes(header - len(info)) if header > len(info) else b""
    offset = 14 + len(info) + len(palette)
    return b"BM" + struct.pack("<IHHI", offset + len(rows), 0, 0, offset) + info + palette + rows


def png_pixels(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, channels, unfiltered pixel bytes) of a PNG written with filter 0 on every row."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, color_type = struct.unpack(">IIBB", data[16:26])
    assert depth == 8
    idat, at = b"", 8
    while at < len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + size]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[at + 8 + size:at + 12 + size])[0]
        idat += body if kind == b"IDAT" else b""
        at += 12 + size
    channels = {2: 3, 6: 4}[color_type]
    raw = zlib.decompress(idat)
    stride = width * channels + 1
    assert all(raw[y * stride] == 0 for y in range(height))
    return width, height, channels, b"".join(raw[y * stride + 1:(y + 1) * stride] for y in range(height))


def expected_rgb(width: int, height: int) -> bytes:
    return b"".join(bytes([x & 0xFF, y & 0xFF, (x + y) & 0xFF]) for y in range(height) for x in range(width))


def read_png(box, name: str) -> tuple[int, int, int, bytes]:
    result = read(box, path=name)
    assert not result.is_error, text(result)
    assert text(result) == "Read image file [image/png]"
    image = result.content[1]
    assert isinstance(image, ImageContent) and image.mime_type == "image/png"
    return png_pixels(base64.b64decode(image.data))


def test_bmp_is_sent_as_png(sandbox):
    """pi converts what the model cannot take: a BMP reaches the model as the same pixels in a PNG."""
    put(sandbox, "shot.bmp", bmp_bytes(5, 3))
    assert read_png(sandbox, "shot.bmp") == (5, 3, 3, expected_rgb(5, 3))
    put(sandbox, "top.bmp", bmp_bytes(7, 2, top_down=True))
    assert read_png(sandbox, "top.bmp") == (7, 2, 3, expected_rgb(7, 2))
    put(sandbox, "x32.bmp", bmp_bytes(3, 4, 32))   # plain 32-bit: the fourth byte is padding, not alpha
    assert read_png(sandbox, "x32.bmp") == (3, 4, 3, expected_rgb(3, 4))


def test_bmp_bitfields_and_palette(sandbox):
    # V5 header with an alpha mask: RGBA. The pixels are stored R, G, B, A (masks say so).
    rgba = bytes([10, 20, 30, 40, 50, 60, 70, 80])
    put(sandbox, "v5.bmp", bmp_bytes(2, 1, 32, compression=3, header=124,
                                     masks=(0xFF, 0xFF00, 0xFF0000, 0xFF000000), rows=rgba))
    assert read_png(sandbox, "v5.bmp") == (2, 1, 4, rgba)
    # 8-bit paletted, two colours used: index 0 is red, 1 is blue (entries are B, G, R, 0); rows padded to 4.
    palette = bytes([0, 0, 255, 0, 255, 0, 0, 0])
    put(sandbox, "p8.bmp", bmp_bytes(3, 2, 8, palette=palette, colors_used=2,
                                     rows=bytes([1, 0, 1, 0, 0, 1, 0, 0])))
    red, blue = bytes([255, 0, 0]), bytes([0, 0, 255])
    assert read_png(sandbox, "p8.bmp") == (3, 2, 3, red + blue + red + blue + red + blue)


def test_bmp_alpha_of_all_zeros_is_no_alpha(sandbox):
    """Writers that do not use a V4/V5 header's alpha fill it with 0: read as alpha, the model would get an image
    it cannot see (all transparent). Browsers show such a BMP opaque; so does the PNG."""
    zero_alpha = bytes([10, 20, 30, 0, 50, 60, 70, 0])
    put(sandbox, "zero.bmp", bmp_bytes(2, 1, 32, compression=3, header=124,
                                       masks=(0xFF, 0xFF00, 0xFF0000, 0xFF000000), rows=zero_alpha))
    assert read_png(sandbox, "zero.bmp") == (2, 1, 3, bytes([10, 20, 30, 50, 60, 70]))
    # One pixel's alpha anywhere is enough for every pixel's to count (this one is a second row's, bottom-up).
    two_rows = bytes([1, 2, 3, 0, 4, 5, 6, 0]) + bytes([7, 8, 9, 0, 10, 11, 12, 255])
    put(sandbox, "some.bmp", bmp_bytes(2, 2, 32, compression=3, header=124,
                                       masks=(0xFF, 0xFF00, 0xFF0000, 0xFF000000), rows=two_rows))
    assert read_png(sandbox, "some.bmp") == (2, 2, 4, bytes([7, 8, 9, 0, 10, 11, 12, 255, 1, 2, 3, 0, 4, 5, 6, 0]))


def test_a_bmp_too_large_as_png_stops_being_converted(sandbox):
    """Noise does not compress: the PNG of a 6 MB BMP is over the image limit, which ends the conversion there (no
    uncompressed copy of the image is held, and no more rows are compressed once the limit is passed)."""
    noise = random.Random(7).randbytes(1536 * 1364 * 3)   # rows of 4092 bytes: no padding
    put(sandbox, "noise.bmp", bmp_bytes(1364, 1536, rows=noise))
    result = read(sandbox, path="noise.bmp")
    assert result.is_error and text(result) == "Image noise.bmp is over the 5.0MB limit for images as PNG."
    with pytest.raises(PngTooLarge):
        bmp_to_png(bmp_bytes(64, 64, rows=noise[:64 * 64 * 3]), max_png=4096)
    assert png_pixels(bmp_to_png(bmp_bytes(5, 3), max_png=4096)) == (5, 3, 3, expected_rgb(5, 3))


def test_hostile_or_unsupported_bmp_is_a_clear_error(sandbox):
    """Sizes in the headers are checked against the bytes there and a pixel cap before anything is allocated."""
    huge = bmp_bytes(1, 1)
    huge = huge[:18] + struct.pack("<ii", 100000, 100000) + huge[26:]   # claims 10^10 pixels in 58 bytes
    cut = bmp_bytes(40, 40)[:500]                                         # claims more pixel data than there is
    rle = bmp_bytes(4, 4, 8, compression=1, palette=bytes(1024), rows=bytes(16))
    odd_mask = bmp_bytes(1, 1, 32, compression=3, masks=(0x7C00, 0x3E0, 0x1F))
    cases = {"huge.bmp": (huge, "over the 16384x16384"), "cut.bmp": (cut, "cut short"),
             "rle.bmp": (rle, "compressed"), "mask.bmp": (odd_mask, "not one whole byte"),
             "b16.bmp": (bmp_bytes(2, 2, 16, rows=bytes(8)), "16 bits per pixel")}
    for name, (data, reason) in cases.items():
        put(sandbox, name, data)
        result = read(sandbox, path=name)
        assert result.is_error and text(result).startswith(f"Cannot convert BMP image {name} to PNG: "), name
        assert reason in text(result), (name, text(result))
    put(sandbox, "bmw.txt", "BMW and Mini\n")   # "BM" at the start of a text file is still text
    assert text(read(sandbox, path="bmw.txt")) == "BMW and Mini\n"


class VanishingSandbox(CountingSandbox):
    """The agent's own process removes the file between pid's reading its head and counting its lines."""

    def read_file(self, path, max_bytes=None, cancel=None):
        data = super().read_file(path, max_bytes=max_bytes, cancel=cancel)
        self.inner.exec(f"rm -f {path}", timeout=60)
        return data


def test_a_huge_file_gone_before_it_is_counted_is_a_clear_error(docker_sandbox):
    """Not a shell's complaint parsed as the line count (`invalid literal for int()`): the read says it failed."""
    docker_sandbox.exec("seq 1 2000000 > gone.txt", timeout=60)
    result = read(VanishingSandbox(docker_sandbox), path="gone.txt")
    assert result.is_error and text(result).startswith("Could not read the file: "), text(result)
    assert "No such file" in text(result)
