"""The reports as people see them: report.html and the merged matrix rendered by headless Chromium
at 1280×800. A screenshot must show the verdict's colour (not a blank page), and a layout probe
(an inline script run after layout, read back with --dump-dom) must find the verdict, every level
row, the implementation, the fallbacks and the speed figures above the fold. Skips, with the
reason, when no Chromium is installed (CI installs the Debian package best-effort)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

import report_fixtures as fixtures
from dflash2rt.qualify import html as report_html
from dflash2rt.qualify.merge import merge

BROWSER = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                           "google-chrome-stable") if shutil.which(n)), None)
pytestmark = [pytest.mark.slow,                      # a headless browser
              pytest.mark.skipif(BROWSER is None, reason="no headless Chromium on PATH (apt-get "
                                 "install chromium): the first screen is not checked in a browser")]
VIEW_W, VIEW_H = 1280, 800
GREEN, RED = (0x1A, 0x7F, 0x37), (0xCF, 0x22, 0x2E)          # the PASS / FAIL backgrounds

PROBE = """<script>(function(){
const box = e => { const r = e.getBoundingClientRect();
  return {top: r.top, bottom: r.bottom, right: r.right, text: e.innerText}; };
const out = {vw: innerWidth, vh: innerHeight, sw: document.documentElement.scrollWidth,
             ids: {}, rows: []};
document.querySelectorAll('[id]').forEach(e => { out.ids[e.id] = box(e); });
document.querySelectorAll('[data-level],[data-batch],[data-backend]').forEach(e => {
  out.rows.push({key: e.dataset.level || e.dataset.batch || e.dataset.backend, ...box(e)}); });
const pre = document.createElement('pre'); pre.id = 'layout-probe';
pre.textContent = JSON.stringify(out); document.body.appendChild(pre); })();</script>"""


ATTEMPTS, ATTEMPT_S = 3, 120


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Chromium with ``args``. Headless Chromium now and then never exits: an attempt that
    outlives ``ATTEMPT_S`` is killed with every process it started, and the next one begins
    with a fresh profile; the test fails only if every attempt hangs."""
    for attempt in range(ATTEMPTS):
        cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions", "--disable-dev-shm-usage",
               f"--user-data-dir={tmp / f'profile-{attempt}'}",
               f"--window-size={VIEW_W},{VIEW_H}", "--run-all-compositor-stages-before-draw",
               "--virtual-time-budget=3000", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=ATTEMPT_S)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)      # its renderer and GPU processes too
            proc.communicate()
    pytest.fail(f"headless Chromium did not finish in {ATTEMPTS} attempts of {ATTEMPT_S} s: "
                f"{' '.join(args)}")


def layout(page: Path, tmp: Path) -> dict:
    """Element boxes (viewport coordinates, no scrolling) measured by Chromium after layout."""
    probed = tmp / f"probe-{page.name}"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"),
                      encoding="utf-8")
    proc = _chromium(tmp, "--dump-dom", probed.as_uri())
    m = re.search(r'<pre id="layout-probe">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"no layout probe in the dumped DOM: {proc.stderr[-2000:]}"
    return json.loads(html.unescape(m.group(1)))


def screenshot(page: Path, tmp: Path) -> Path:
    png = tmp / f"{page.stem}.png"
    proc = _chromium(tmp, f"--screenshot={png}", page.as_uri())
    assert png.is_file(), proc.stderr[-2000:]
    return png


def png_rows(path: Path, max_rows: int) -> np.ndarray:
    """The first ``max_rows`` rows of an 8-bit RGB(A) PNG screenshot as [rows, width, 3]."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h, bpp = 8, b"", 0, 0, 4
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and not interlace, (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert (w, h) == (VIEW_W, VIEW_H), (w, h)
    raw, stride = zlib.decompress(idat), w * bpp
    rows, prev = [], np.zeros(stride, np.uint8)
    for y in range(min(h, max_rows)):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).copy()
        if f == 1:                                        # Sub: a running sum along the row
            line = (line.reshape(w, bpp).astype(np.uint32).cumsum(0) & 255).astype(
                np.uint8).ravel()
        elif f == 2:                                      # Up
            line += prev
        elif f in (3, 4):                                 # Average, Paeth: byte by byte
            cur, up = bytearray(line.tobytes()), prev.tobytes()
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                b, c = up[i], up[i - bpp] if i >= bpp else 0
                if f == 3:
                    cur[i] = (cur[i] + (a + b) // 2) & 255
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            line = np.frombuffer(bytes(cur), np.uint8)
        rows.append(line)
        prev = line
    return np.stack(rows).reshape(len(rows), w, bpp)[:, :, :3]


def colour_counts(path: Path, *rgbs: tuple[int, int, int], max_rows: int = 300) -> list[int]:
    """Pixels of exactly each ``rgb`` in the top rows, then the number of distinct colours."""
    px = png_rows(path, max_rows).astype(np.uint32)
    packed = (px[..., 0] << 16) | (px[..., 1] << 8) | px[..., 2]
    return [int((packed == (r << 16 | g << 8 | b)).sum()) for r, g, b in rgbs] + \
        [len(np.unique(packed))]


def above_fold(box: dict, fold: float = VIEW_H) -> bool:
    return 0 <= box["top"] < box["bottom"] <= fold


def _write(tmp: Path, name: str, report: dict) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "report.json").write_text(json.dumps(report), encoding="utf-8")
    page = d / "report.html"
    page.write_text(report_html.render(report), encoding="utf-8")
    return page


def test_passing_report_first_screen(tmp_path):
    page = _write(tmp_path, "cpu", fixtures.passing_cpu())
    green, red, colours = colour_counts(screenshot(page, tmp_path), GREEN, RED)
    assert green > 5000 and red == 0 and colours > 20, (green, red, colours)   # PASS, not blank
    lay = layout(page, tmp_path)
    assert lay["vw"] == VIEW_W and lay["sw"] <= VIEW_W, lay       # no horizontal scrolling
    ids = lay["ids"]
    for key in ("first-screen", "verdict", "levels", "implementation", "ops", "fallbacks",
                "speed", "block-size", "device", "commit"):
        assert key in ids and above_fold(ids[key]), (key, ids.get(key))
    assert ids["verdict"]["text"] == "PASS"
    assert ids["fallbacks"]["text"] == "none" and ids["block-size"]["text"] == "8"
    assert "torch ops (all ops)" in ids["ops"]["text"]
    assert ids["commit"]["text"].startswith("e3cf9ee") and "x86_64" in ids["device"]["text"]
    rows = {r["key"]: r for r in lay["rows"]}
    for lv, shown in (("L0", "12 / 12"), ("L1", "198 / 85"), ("L4", "3 / 3"),
                      ("graphs", "SKIPPED")):
        assert above_fold(rows[lv]) and shown in rows[lv]["text"], rows[lv]
    for batch, figures in (("1", ("39.75", "104.4", "×2.626", "6.8")),
                           ("4", ("114.9", "183.2", "×1.594", "3.72"))):
        assert above_fold(rows[batch]) and all(f in rows[batch]["text"] for f in figures)
    assert ids["system"]["top"] > ids["first-screen"]["bottom"]   # the raw table comes after


def test_failing_report_shows_reasons_above_the_fold(tmp_path):
    page = _write(tmp_path, "cuda", fixtures.failing_gpu())
    red, green, _ = colour_counts(screenshot(page, tmp_path), RED, GREEN)
    assert red > 5000 and green == 0, (red, green)
    lay = layout(page, tmp_path)
    ids, rows = lay["ids"], {r["key"]: r for r in lay["rows"]}
    assert ids["verdict"]["text"] == "FAIL" and above_fold(ids["reasons"])
    assert "collection error" in ids["reasons"]["text"] and "2 more reason(s)" in \
        ids["reasons"]["text"]
    assert "FAIL" in rows["L1"]["text"] and "2 / 5" in rows["graphs"]["text"]
    assert "torch ops: verify, noise" in ids["ops"]["text"] and above_fold(ids["ops"])
    assert "out of shared memory" in ids["fallbacks"]["text"] and above_fold(ids["fallbacks"])
    assert lay["sw"] <= VIEW_W and above_fold(ids["first-screen"])


def test_old_report_says_not_recorded(tmp_path):
    r = fixtures.passing_cpu()
    del r["verdict"]
    conf = r["sections"]["conformance"]
    del conf["implementation"]
    for lv in conf["levels"].values():
        del lv["executed"], lv["minimum"]
    page = _write(tmp_path, "old", r)
    ids = layout(page, tmp_path)["ids"]
    assert ids["verdict"]["text"] == "verdict not recorded" and above_fold(ids["verdict"])
    assert ids["ops"]["text"] == "not recorded"
    assert ids["levels"]["text"].count("not recorded") == 6


def test_merged_matrix_first_screen(tmp_path):
    dirs = [_write(tmp_path, n, r).parent for n, r in (("cpu", fixtures.passing_cpu()),
                                                        ("cuda", fixtures.failing_gpu()))]
    merge(dirs, tmp_path / "matrix")
    page = tmp_path / "matrix" / "matrix.html"
    green, red, _ = colour_counts(screenshot(page, tmp_path), GREEN, RED)
    assert green > 500 and red > 500, (green, red)
    lay = layout(page, tmp_path)
    assert lay["sw"] <= VIEW_W and above_fold(lay["ids"]["verdict-matrix"]), lay["ids"]
    rows = {r["key"]: r for r in lay["rows"]}
    cells = {b: re.sub(r"\s+", " ", rows[b]["text"]) for b in ("cpu", "cuda")}
    assert cells["cpu"].startswith("cpu PASS PASS 12/12 PASS 198/85"), cells["cpu"]
    assert "FAIL 2/5" in cells["cuda"] and "out of shared memory" in cells["cuda"], cells["cuda"]
    assert all(above_fold(rows[b]) for b in ("cpu", "cuda"))
