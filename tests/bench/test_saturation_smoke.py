"""The saturation benchmark, small: many streams at once on every transport and client, each
answer complete and rebuilt exactly from its (possibly merged) deltas. Correctness only; the
rates are the benchmark's (``make saturation``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from bidi_responses.bench.clients import ServerAddress
from bidi_responses.bench.saturation import TRANSPORTS, main, run_streams, summary

from tests.conftest import ServerFactory, make_config

pytestmark = pytest.mark.timeout(120)

_ANSWER = 400


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_stream_gets_its_whole_answer(
    server_factory: ServerFactory, tmp_path: Path, transport: str
) -> None:
    # A fast engine and more streams than the writers keep up with: deltas queue and merge.
    config = make_config(tmp_path, tokens_per_second=20_000, answer_tokens=_ANSWER, tool_rounds=0)
    running = await server_factory(config, http=True)
    assert running.http_port is not None
    address = ServerAddress("127.0.0.1", running.grpc_port, running.http_port)
    async with asyncio.timeout(90):
        results = await run_streams(address, transport, range(12), time.time())
    # Every stream was open before the first create went: opening is not part of serving.
    assert min(r.sent for r in results) >= max(r.opened for r in results) > 0
    for result in results:
        assert result.status == "completed" and result.tokens == _ANSWER
        assert result.text == result.done_text and len(result.text) > _ANSWER
        assert result.increasing and result.messages >= 1
    row = summary(transport, 12, results, 20_000, _ANSWER)
    assert row["correct"] == 12 and row["median_tok_s"] > 0


def test_unknown_transports_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--transports", "websocket,carrier_pigeon"])
    assert exit_info.value.code == 2
    assert "carrier_pigeon" in capsys.readouterr().err
