"""What the `file` and `kube` commands' flags set (kpng_py/brain/settings.py)."""

from __future__ import annotations

import pytest

from kpng_py.brain.settings import Coalesce, Settle


@pytest.mark.parametrize("seconds, incomplete", [(0.2, 5.0), (1.0, 5.0), (8.0, 8.0)])
def test_a_settle_time_never_waits_less_for_a_content_cut_short_than_the_default(
        seconds: float, incomplete: float) -> None:
    assert Settle.after(seconds) == Settle(seconds, incomplete)


def test_a_coalesce_time_waits_at_most_ten_times_the_quiet_time_after_the_first_change() -> None:
    assert Coalesce.after(0.5) == Coalesce(quiet=0.5, longest=5.0)
    assert Coalesce.after(0) == Coalesce(0, 0)
