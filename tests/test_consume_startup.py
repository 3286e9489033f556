"""``olu consume`` stops cleanly on a SIGTERM that arrives during its start-up (imports, database, broker connection:
seconds on a cold, loaded machine), before the event loop's own handlers are in place: exit 0, not killed by the
signal (-15).  Seen in CI as a flaky two-consumer stream test whose second consumer was terminated while starting.

The consumer is replaced by a stand-in whose construction sends the process a SIGTERM, so the signal lands exactly
in the start-up window, with no broker needed; without the early handler the process dies of it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import asyncio, os, signal, sys
    import app.streaming.consumer as consumer_module
    from app.cli import app

    class StandIn:
        tenant_id, durable = "ten_x", "olu-ten_x"

        def __init__(self):
            self.stopping = asyncio.Event()

        async def connect(self):
            pass

        def install_signal_handlers(self):
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, self.stop)

        def stop(self):
            self.stopping.set()

        async def run(self):
            await asyncio.wait_for(self.stopping.wait(), timeout=20)
            print("stopped before consuming anything", flush=True)

    class NoDatabase:
        def dispose(self):
            pass

    def build(settings, api_key, cfg):
        os.kill(os.getpid(), signal.SIGTERM)  # the orchestrator's stop, while the consumer is still starting
        return StandIn(), NoDatabase()

    consumer_module.build = build
    sys.argv = ["olu", "consume", "--api-key", "olu_x"]
    app()
""")


def test_sigterm_during_start_up_stops_cleanly(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OLU_DATA_DIR": str(tmp_path), "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "stopped before consuming anything" in r.stdout
