"""``dflash2rt watermark keygen`` / ``detect``: JSON fields, text through the bundled tokenizer,
typed errors with exit status 2, and the key never printed."""

from __future__ import annotations

import json

import pytest
import torch

from dflash2rt.cli import main
from dflash2rt.watermark import WatermarkKey, sampler, values


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _assert_no_secret(key_file, *texts):
    secret = key_file.read_text().strip()
    for t in texts:
        assert secret not in t and secret.upper() not in t and secret[:12] not in t


def test_keygen_and_detect_tokens_json(tmp_path, capsys):
    kf = tmp_path / "wm.key"
    rc, out, err = _run(capsys, "watermark", "keygen", "--out", str(kf))
    assert rc == 0 and kf.is_file() and "fingerprint" in out
    key = WatermarkKey.from_file(kf)
    seq = [11, 12, 13, 14]
    for _ in range(60):
        # a near-uniform law over 50 tokens: no (context, token) pair repeats in practice, so
        # every position after the first 4 is scored whatever key keygen draws
        p = torch.softmax(torch.arange(50.0).sin() * 0.5, -1).view(1, -1)
        ctx = values.context_hash(torch.tensor(seq[-4:]).view(1, -1))
        seq.append(int(sampler.draw_dense(key.target, ctx, p)[0]))
    tf = tmp_path / "t.json"
    tf.write_text(json.dumps(seq))
    rc, out2, err2 = _run(capsys, "watermark", "detect", "--key-file", str(kf), "--tokens",
                          str(tf), "--json", "--fpr", "0.001")
    assert rc == 0
    res = json.loads(out2)
    assert {"p_value", "score", "tokens_scored", "watermarked"} <= set(res)
    assert res["watermarked"] is True and res["fpr"] == 0.001 and res["tokens_scored"] >= 40
    assert res["tokens_scored"] + res["repeated_skipped"] == len(seq) - 4 == res["tokens_total"] - 4
    rc, out3, err3 = _run(capsys, "watermark", "detect", "--key-file", str(kf), "--tokens", str(tf))
    assert rc == 0 and out3.startswith("watermarked at fpr 0.01")
    _assert_no_secret(kf, out, err, out2, err2, out3, err3)


def test_detect_text_with_bundled_tokenizer(tmp_path, capsys):
    kf = tmp_path / "wm.key"
    WatermarkKey.generate().save(kf)
    text = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
    rc, out, err = _run(capsys, "watermark", "detect", "--key-file", str(kf), "--text", text,
                        "--json")
    assert rc == 0
    res = json.loads(out)
    assert res["tokens_total"] > 8 and res["tokens_scored"] > 0 and 0 < res["p_value"] <= 1
    _assert_no_secret(kf, out, err)


@pytest.mark.parametrize("case,match", [
    ("missing_key", "cannot read watermark key file"),
    ("bad_tokens_json", "not JSON"),
    ("tokens_not_list", "JSON list of token ids"),
    ("negative_token", "token 1 is -5"),
    ("no_tokenizer_dir", "no tokenizer.json"),
    ("keygen_exists", "refusing to overwrite"),
])
def test_errors_exit_2_with_a_message(tmp_path, capsys, case, match):
    kf = tmp_path / "wm.key"
    WatermarkKey.generate().save(kf)
    tf = tmp_path / "t.json"
    argv = ["watermark", "detect", "--key-file", str(kf), "--tokens", str(tf)]
    if case == "missing_key":
        argv[3] = str(tmp_path / "nope")
        tf.write_text("[1, 2]")
    elif case == "bad_tokens_json":
        tf.write_text("[1, 2")
    elif case == "tokens_not_list":
        tf.write_text('{"a": 1}')
    elif case == "negative_token":
        tf.write_text("[1, -5, 3]")
    elif case == "no_tokenizer_dir":
        argv = ["watermark", "detect", "--key-file", str(kf), "--text", "hi", "--model",
                str(tmp_path)]
    else:
        argv = ["watermark", "keygen", "--out", str(kf)]
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and match in err, err
    _assert_no_secret(kf, out, err)
