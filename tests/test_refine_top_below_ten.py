"""refine_top below 10 is refused at config load: the parity gate admits a reduced precision on
the golden set's fp32 top-10 order, which a refinement of fewer documents does not promise."""

from __future__ import annotations

import msgspec
import pytest

from schemas.config import Settings


def _settings(**model: object) -> Settings:
    base = {"name": "m", "engine": "openvino", "path": "/m", "precision": "bf16"}
    return msgspec.convert({"models": [{**base, **model}]}, Settings)


@pytest.mark.parametrize("top", [1, 9])
def test_refine_top_below_ten_is_refused_in_one_line(top):
    with pytest.raises(msgspec.ValidationError, match=r"refine_top .*top-10.*models\[0\]") as info:
        _settings(refine_top=top)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("top", [0, 10, 25])
def test_refine_top_off_or_ten_and_more_is_accepted(top):
    assert _settings(refine_top=top).models[0].refine_top == top
