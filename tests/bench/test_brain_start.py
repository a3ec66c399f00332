"""The brain's start on its own: the state file in each style is the same
state, and each takes the brain's fast read, its services as items."""

from __future__ import annotations

from bench.brain_start import STYLES, state_file_in_style
from bench.e2e_sync import state_file_text
from bench.scenario import Scenario
from kpng_py.brain.items import split_services
from kpng_py.brain.statefile import StateReader, parse_state


def test_every_style_is_the_bench_state_and_read_fast() -> None:
    scenario = Scenario(30, 3)
    block = state_file_in_style(scenario, "block")
    assert block == state_file_text(scenario)
    texts = {style: state_file_in_style(scenario, style) for style in STYLES}
    assert len(set(texts.values())) == len(STYLES)
    for text in texts.values():
        assert StateReader("state").read_plain(text) == parse_state(block.encode(), "state")
        assert len(split_services(text)[1]) == 30
