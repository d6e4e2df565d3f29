"""The kernel catalogue loads, and a typo in it is a one-line error naming file and key."""

from __future__ import annotations

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.kernels import get_kernel, load_kernels
from sm120patch.errors import RecipeError, UserError


def test_shipped_catalogue() -> None:
    k = load_kernels()
    comm = k["flashinfer:trtllm_comm"]
    assert (comm.module, comm.generator) == ("flashinfer.jit.comm", "gen_trtllm_comm_module")
    assert k["flashinfer:cutlass_fused_moe_sm120"].generator == "gen_cutlass_fused_moe_sm120_module"
    gen = k["flashinfer:trtllm_gen_moe"]
    assert gen.absent_on(parse_arch("sm_120")) and gen.absent_on(parse_arch("sm_121"))
    assert not gen.absent_on(parse_arch("sm_100"))


def _write(tmp_path, body: str):
    p = tmp_path / "kernels.toml"
    p.write_text(body)
    return p


BASE = '["flashinfer:x"]\ntitle = "t"\nwhy = "w"\nfile = "jit/x.py"\ngenerator = "gen_x"\n'


def test_unknown_key(tmp_path) -> None:
    p = _write(tmp_path, BASE + 'generatr = "typo"\n')
    with pytest.raises(RecipeError) as e:
        load_kernels(p)
    msg = str(e.value)
    assert str(p) in msg and "flashinfer:x.generatr" in msg and "unknown key" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "extra, key",
    [
        ('must_be_absent_on = ["sm_x"]\n', "must_be_absent_on[0]"),
        ('run = "matmul"\n', "run"),
        ('jit_modules = "x"\n', "jit_modules"),
    ],
)
def test_bad_values(tmp_path, extra: str, key: str) -> None:
    with pytest.raises(RecipeError, match=key.replace("[", r"\[")):
        load_kernels(_write(tmp_path, BASE + extra))


def test_bad_file_and_missing(tmp_path) -> None:
    with pytest.raises(RecipeError, match="file"):
        load_kernels(_write(tmp_path, BASE.replace("jit/x.py", "../x.py")))
    with pytest.raises(RecipeError, match="generator: is missing"):
        load_kernels(_write(tmp_path, BASE.replace('generator = "gen_x"\n', "")))
    with pytest.raises(RecipeError, match="invalid TOML"):
        load_kernels(_write(tmp_path, "[[[ nope"))
    with pytest.raises(RecipeError, match="cannot read"):
        load_kernels(tmp_path / "absent.toml")


def test_non_utf8_catalogue_is_a_usage_error(tmp_path) -> None:
    """The CLI's view: a catalogue that is not UTF-8 is the user's file to fix (exit 2), not a bug."""
    bad = tmp_path / "kernels.toml"
    bad.write_bytes(BASE.encode() + b"# caf\xe9\n")
    with pytest.raises(RecipeError, match="not UTF-8") as e:
        load_kernels(bad)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


def test_unknown_need() -> None:
    with pytest.raises(UserError, match="unknown kernel"):
        get_kernel("flashinfer:nope")
