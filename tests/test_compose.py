"""compose.yaml run in containers with podman-compose (issue 31): the topology as users get it, with stand-in images
for postgres, nats and nginx made of Debian's packages where no registry can be reached (containers/
compose.standins.yaml changes only the images), and the service's image built from the Dockerfile (tests/
containers.py).

Brought up by containers/compose-up.sh, the users' way (issue 40), in the stages podman 4.3 needs (it ignores
`condition: service_healthy`, podman-compose says so, and its `--requires` graph fails on a dependency's dependency,
hence `--no-deps`): postgres and nats, then `migrate` once PostgreSQL answers, then the api replicas and the proxy,
then the consumers with a tenant's key.  The script runs three times: from nothing; again over a failed attempt (the
file brought up all at once, as the docs once said, after a `down`), which it clears and brings up again with the
data kept (the tenant made after the first run is still there); and over the running topology with the tenant's
key, which leaves it as it is and starts the consumers.  Then, through the
proxy on 127.0.0.1: learns, forgets and predicts from a client thread while one api replica is SIGKILLed and
started again, and the PostgreSQL container is SIGKILLed once and started again (requests fail cleanly with 503 or
the proxy's 502 meanwhile, never a 500); every acknowledged learn is in the model afterwards, no receipt is
duplicated, the model's steps have no gaps and the ledger's rho is the receipts' sum.

Broker traffic: compose.yaml publishes no NATS port, so a publisher (PUBLISHER below) runs inside an api container
(`podman exec`; the image has nats-py) and publishes learn and forget events to nats://nats:4222 on the back-end
network, recording which publications JetStream acknowledged, while one consumer container is SIGKILLed and started
again, then the NATS container (its stream is on the natsdata volume).  Publications while NATS is dead are not
acknowledged (they fail in the client) and publishing resumes once it is back; every acknowledged event is recorded
as applied by the consumers (stream_events, read with psql in the postgres container), each acknowledged learn's
records are in the model and each acknowledged forget's record is forgotten, each record counted once (steps 1..step,
one receipt per forgotten record) and the ledger's rho is the receipts' sum.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from . import containers
from .conftest import free_port
from .helpers import all_receipts, create_model, unit_rows
from .procs import REPO

TIMINGS = containers.TIMINGS

PODMAN_COMPOSE = shutil.which("podman-compose") or str(Path(os.sys.executable).with_name("podman-compose"))
STANDINS = {"postgres": "localhost/olu-standin-postgres:15", "nats": "localhost/olu-standin-nats:2",
            "proxy": "localhost/olu-standin-nginx:1.22"}


def _problem() -> str | None:
    p = containers.problem()
    if p:
        return p
    if not Path(PODMAN_COMPOSE).exists():
        return "podman-compose is not installed (pip install podman-compose; it is in the test extra)"
    return None


# one pytest-xdist worker runs every container test (--dist loadgroup): they share the builds and podman's store
_PROBLEM = _problem()
pytestmark = [pytest.mark.xdist_group("containers"), pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))]


def build_standins() -> None:
    """The stand-in images (containers/*/Containerfile on the Debian base), built when missing."""
    base = containers.base()
    with containers._locked("standins"):
        for service, tag in STANDINS.items():
            if not containers.image_exists(tag):
                started = time.perf_counter()
                folder = {"postgres": "postgres", "nats": "nats", "proxy": "proxy"}[service]
                r = subprocess.run(["podman", "build", "--pull=never", "--format", "docker", "--build-arg",
                                    f"BASE={base}", "-f", str(REPO / "containers" / folder / "Containerfile"), "-t", tag,
                                    str(REPO / "containers")], env=containers.env(), capture_output=True, text=True,
                                   timeout=1200)
                if r.returncode != 0:
                    raise RuntimeError(f"stand-in {tag}: {(r.stdout + r.stderr)[-3000:]}")
                containers.TIMINGS[f"stand-in {tag}"] = time.perf_counter() - started


class Topology:
    def __init__(self, project: str, port: int):
        self.project, self.port = project, port
        self.env = {**containers.env(), "OLU_ENCRYPTION_KEY": containers_key(), "OLU_SIGNING_KEY": containers_key(),
                    "OLU_ADMIN_TOKEN": secrets.token_hex(24), "POSTGRES_PASSWORD": secrets.token_hex(16),
                    "OLU_HTTP_PORT": str(port), "OLU_STREAM_API_KEY": "none", "OLU_CONSUMERS": "2",
                    "OLU_REPLICAS": "2", "OLU_LOG_LEVEL": "WARNING",
                    "OLU_IDEMPOTENCY_STALE_SECONDS": "10", "OLU_STREAM_ACK_WAIT": "5", "OLU_PROXY_SUBNET": "172.29.31.0/24"}
        self.url = f"http://127.0.0.1:{port}"

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        r = subprocess.run([PODMAN_COMPOSE, "-p", self.project, "-f", str(REPO / "compose.yaml"), "-f",
                            str(REPO / "containers" / "compose.standins.yaml"), *args], cwd=REPO, env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        return r

    def up(self, *services: str) -> None:
        r = self.compose("up", "-d", "--no-build", "--no-deps", *services)
        failed = [line for line in r.stderr.splitlines() if line.startswith("Error")]
        assert r.returncode == 0 and not failed, r.stderr[-3000:]

    def name(self, service: str, n: int = 1) -> str:
        return f"{self.project}_{service}_{n}"

    def wait(self, what, timeout: float = 180, poll: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline, f"timed out waiting: {self.logs()}"
            time.sleep(poll)

    def pg_ready(self) -> bool:
        return containers.podman("exec", self.name("postgres"), "pg_isready", "-q", "-h", "127.0.0.1", "-U", "olu",
                                 "-d", "olu", check=False).returncode == 0

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/readyz", timeout=3).status_code == 200
        except httpx.HTTPError:
            return False

    def logs(self) -> str:
        out = containers.podman("ps", "-a", "--format", "{{.Names}} {{.Status}}", check=False).stdout
        for svc in ("migrate", "api", "proxy", "consumer"):
            out += containers.podman("logs", "--tail", "15", self.name(svc), check=False).stderr[-1500:]
        return out

    def script(self) -> str:
        """containers/compose-up.sh with the stand-in images; its stderr (it must succeed)."""
        env = {**self.env, "OLU_COMPOSE_PROJECT": self.project, "OLU_COMPOSE": PODMAN_COMPOSE, "OLU_COMPOSE_BUILD": "0",
               "OLU_COMPOSE_IMAGE": containers.IMAGE, "OLU_COMPOSE_ENV_FILE": f"/tmp/{self.project}.env",
               "OLU_READY_TIMEOUT": "240"}
        r = subprocess.run(["bash", str(REPO / "containers" / "compose-up.sh"),
                            str(REPO / "containers" / "compose.standins.yaml")], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, (r.stderr[-4000:], self.logs())
        assert "compose-up: up: http://127.0.0.1:" in r.stderr and "generated" not in r.stderr, r.stderr[-3000:]
        return r.stderr

    def start(self) -> str:
        started = time.perf_counter()
        first = self.script()  # from nothing
        assert "no consumers started" in first and "removing them" not in first, first[-2000:]
        TIMINGS["compose-up.sh from nothing"] = time.perf_counter() - started
        assert self.ready()
        admin = {"authorization": f"Bearer {self.env['OLU_ADMIN_TOKEN']}"}
        tenant = httpx.post(self.url + "/v1/tenants", json={"name": "compose"}, headers=admin, timeout=30).json()
        key, self.tenant_id = tenant["api_key"], tenant["id"]
        # a failed attempt, as podman 4.3 makes one of the file brought up all at once: migrate started before
        # PostgreSQL answers (here: with no PostgreSQL at all) exits 1, and the api replicas never get ready
        self.compose("down", "-t", "2")
        self.compose("up", "-d", "--no-build", "--no-deps", "migrate", "api", timeout=600)
        self.wait(lambda: containers.podman("inspect", "-f", "{{.State.Status}}", self.name("migrate"),
                                            check=False).stdout.strip() == "exited", timeout=120)
        assert containers.podman("inspect", "-f", "{{.State.ExitCode}}", self.name("migrate")).stdout.strip() != "0"
        started = time.perf_counter()
        again = self.script()
        TIMINGS["compose-up.sh over a failed attempt"] = time.perf_counter() - started
        assert "removing them" in again, again[-2000:]
        r = httpx.get(f"{self.url}/v1/tenants/{self.tenant_id}", headers=admin, timeout=30)
        assert r.status_code == 200, r.text  # the data were kept
        # the running topology with a tenant's key: left as it is, the consumers started
        self.env["OLU_STREAM_API_KEY"] = key
        third = self.script()
        assert "leaving it as it is" in third and "consumer" in third, third[-2000:]
        return key

    def down(self) -> None:
        self.compose("down", "-v", "-t", "2", timeout=300)


def containers_key() -> str:
    import base64

    return base64.b64encode(os.urandom(32)).decode()


class Writer:
    """Learns (unique ids, an Idempotency-Key each, retried on 502/503/504 and connection errors) and forgets of its
    own acknowledged records, then a predict, in a loop through the proxy; records what was acknowledged."""

    def __init__(self, url: str, key: str, mid: str):
        self.c = httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=30)
        self.mid, self.acked, self.forgotten, self.statuses, self.n = mid, [], [], {}, 0
        self.server_errors: list[str] = []
        self.steps: list[tuple[int, int]] = []
        self.X = unit_rows(400, 3, seed=5)

    def _post(self, path: str, body: dict) -> httpx.Response | None:
        idem = secrets.token_hex(8)
        for _ in range(120):
            try:
                r = self.c.post(path, json=body, headers={"idempotency-key": idem})
            except httpx.HTTPError:
                self.statuses["connection error"] = self.statuses.get("connection error", 0) + 1
                time.sleep(0.5)
                continue
            self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500 and r.status_code not in (502, 503, 504):
                self.server_errors.append(f"{path} {r.status_code} {r.text[:300]}")
            if r.status_code in (409, 502, 503, 504):
                time.sleep(0.5)
                continue
            return r
        return None

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            i = self.n
            self.n += 1
            ids = [f"w{i}-{j}" for j in range(3)]
            body = {"examples": [{"id": rid, "x": self.X[(3 * i + j) % 400].tolist(), "y": float(j % 2)}
                                 for j, rid in enumerate(ids)]}
            r = self._post(f"/v1/models/{self.mid}/learn", body)
            if r is not None and r.status_code == 200:
                self.acked += ids
                self.steps.append((r.json()["first_step"], r.json()["last_step"]))
            if i % 3 == 2 and self.acked:
                victim = next((x for x in self.acked if x not in self.forgotten), None)
                r = self._post(f"/v1/models/{self.mid}/unlearn", {"ids": [victim]})
                if r is not None and r.status_code == 200:
                    self.forgotten.append(victim)
            time.sleep(0.05)


@pytest.fixture(scope="module")
def topology():
    containers.build_image()
    build_standins()
    t = Topology(f"olutest{secrets.token_hex(3)}", free_port())
    try:
        started = time.perf_counter()
        key = t.start()
        print(f"\ncompose up (containers/compose-up.sh three times, 2 api replicas, 2 consumers): "
              f"{time.perf_counter() - started:.1f} s")
        for what, seconds in containers.TIMINGS.items():
            if what != "build log":
                print(f"  {what}: {seconds:.1f} s")
        yield t, key
    finally:
        t.down()


def _under_load(t: Topology, key: str, victims: list[str]) -> tuple[Writer, dict, str]:
    """A writer through the proxy while each victim container is SIGKILLed, then started again."""
    with httpx.Client(base_url=t.url, headers={"authorization": f"Bearer {key}"}, timeout=30) as c:
        mid = create_model(c, dim=3)["id"]
    w = Writer(t.url, key, mid)
    stop = threading.Event()
    thread = threading.Thread(target=w.run, args=(stop,), daemon=True)
    thread.start()
    figures: dict = {"kills": []}
    try:
        for victim in victims:
            time.sleep(3)
            containers.podman("kill", "-s", "KILL", victim)
            time.sleep(2)
            t0 = time.perf_counter()
            containers.podman("start", victim)
            t.wait(t.pg_ready if "postgres" in victim else t.ready)
            figures["kills"].append((victim, round(time.perf_counter() - t0, 1)))
        time.sleep(3)
    finally:
        stop.set()
        thread.join(timeout=180)
    assert not thread.is_alive()
    t.wait(t.ready)
    return w, figures, mid


def _check(t: Topology, key: str, w: Writer, figures: dict, mid: str) -> None:
    with httpx.Client(base_url=t.url, headers={"authorization": f"Bearer {key}"}, timeout=30) as c:
        model = c.get(f"/v1/models/{mid}").json()
        receipts = all_receipts(c, mid)
        ledger = c.get(f"/v1/models/{mid}/ledger").json()
        status = {}
        for rid in w.acked:
            r = c.get(f"/v1/audit/records/{rid}")
            status[rid] = next((e["status"] for e in (r.json()["models"] if r.status_code == 200 else [])
                                if e["model_id"] == mid), None)
    figures.update(acked_learns=len(w.acked), acked_forgets=len(w.forgotten), statuses=w.statuses,
                   receipts=len(receipts))
    print(f"\ncompose kills: {figures}")
    assert not w.server_errors, (w.server_errors, t.logs())
    assert w.acked and w.forgotten, figures
    lost = [rid for rid, st in status.items() if st not in ("learned", "forgotten")]
    assert not lost, f"acknowledged learns lost: {lost[:5]}"
    assert sorted(rid for rid, st in status.items() if st == "forgotten") == sorted(w.forgotten)
    assert model["step"] == model["n_records"] == len(w.acked), (model, figures)
    assert model["n_forgotten"] == len(receipts) == len(w.forgotten), (model, figures)
    assert len({r["id"] for r in receipts}) == len({r["record_commitment"] for r in receipts}) == len(receipts)
    # the steps have no gaps: the acknowledged learns tile 1..step
    expected = 1
    for first, last in sorted(w.steps):
        assert first == expected, f"a step gap before {first}"
        expected = last + 1
    assert expected == model["step"] + 1
    assert abs(ledger["rho_spent"] - sum(r["mechanism"]["rho"] for r in receipts)) < 1e-9, ledger


def test_api_replicas_sigkilled_under_load(topology):
    t, key = topology
    w, figures, mid = _under_load(t, key, [t.name("api", 2), t.name("api", 1), t.name("api", 2)])
    _check(t, key, w, figures, mid)


def test_postgres_sigkilled_under_load(topology):
    """Was a strict xfail (issue 31): while the container was gone its name left the network's DNS and psycopg's
    "failed to resolve host 'postgres'" answered 500; now 503 database-unavailable (tests/test_database_unavailable.py)."""
    t, key = topology
    w, figures, mid = _under_load(t, key, [t.name("postgres")])
    _check(t, key, w, figures, mid)


# Run INSIDE an api container (it has the app's nats-py and sits on the backend network; compose.yaml publishes no
# NATS port): learn and forget events of the given models to nats://nats:4222 until its stdin closes, one JSON line per
# publication with whether JetStream acknowledged it.  Forgets name only records of acknowledged learns.
PUBLISHER = r"""
import asyncio, json, math, random, sys, threading, time
import nats
tenant, mids, tag = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
rng = random.Random(7)
def row():
    v = [rng.gauss(0, 1) for _ in range(3)]
    n = math.sqrt(sum(a * a for a in v))
    return [a / n for a in v]
async def main():
    async def quiet(e=None):
        pass
    nc = await nats.connect("nats://nats:4222", max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                            error_cb=quiet, disconnected_cb=quiet, reconnected_cb=quiet)
    js = nc.jetstream()
    learned, asked, k = {m: [] for m in mids}, set(), 0
    while not stop.is_set():
        mid = rng.choice(mids)
        left = [i for i in learned[mid] if i not in asked]
        if len(left) > 3 and rng.random() < 0.3:
            victim = rng.choice(left)
            asked.add(victim)
            ev = {"id": f"{tag}-{k}", "kind": "unlearn", "body": {"ids": [victim]}}
        else:
            ids = [f"{tag}-{k}-{j}" for j in range(rng.randint(1, 2))]
            ev = {"id": f"{tag}-{k}", "kind": "learn",
                  "body": {"examples": [{"id": i, "x": row(), "y": float(j % 2)} for j, i in enumerate(ids)]}}
        t = time.monotonic()
        try:
            await js.publish(f"olu.{tenant}.{mid}.events", json.dumps(ev).encode(), timeout=1)
            ok, err = True, None
            if ev["kind"] == "learn":
                learned[mid] += [x["id"] for x in ev["body"]["examples"]]
        except Exception as e:
            ok, err = False, type(e).__name__
        print(json.dumps({"mid": mid, "ev": ev, "ok": ok, "err": err, "t": t, "done": time.monotonic()}), flush=True)
        k += 1
        await asyncio.sleep(0.05 if ok else 0.2)
    try:
        await asyncio.wait_for(nc.close(), 5)
    except Exception:
        pass
asyncio.run(main())
"""


class Publisher:
    """PUBLISHER in a container, its lines collected by a thread (times are the container's clock: the host's)."""

    def __init__(self, container: str, tenant_id: str, mids: list[str]):
        self.lines: list[dict] = []
        self.p = subprocess.Popen(["podman", "exec", "-i", container, "python", "-c", PUBLISHER, tenant_id,
                                   ",".join(mids), f"ev{secrets.token_hex(3)}"], env=containers.env(),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def stop(self) -> str:
        self.p.stdin.close()
        self.p.wait(timeout=60)
        self.reader.join(timeout=10)
        return self.p.stderr.read()[-2000:]


def _stream_rows(t: Topology) -> dict[str, tuple[str, str]]:
    """event id -> (model id, outcome, stream sequence) of the tenant's events the consumers recorded (psql in the postgres
    container)."""
    out = containers.podman("exec", t.name("postgres"), "psql", "-U", "olu", "-d", "olu", "-At", "-F", "|", "-c",
                            f"SELECT event_id, model_id, outcome, seq FROM stream_events WHERE tenant_id = '{t.tenant_id}'"
                            ).stdout
    return {e: (m, o, int(q)) for e, m, o, q in (line.split("|") for line in out.splitlines() if line)}


def test_consumer_and_nats_sigkilled_under_broker_traffic(topology):
    """Learn and forget events published to the compose NATS from inside an api container while one consumer
    container is SIGKILLed and started again, then the NATS container: publishes during the outage are not
    acknowledged (they fail in the client), publishing resumes once NATS is back with its stream (natsdata volume),
    and every acknowledged event is applied once."""
    t, key = topology
    with httpx.Client(base_url=t.url, headers={"authorization": f"Bearer {key}"}, timeout=30) as c:
        mids = [create_model(c, dim=3, name=f"broker-{i}")["id"] for i in range(2)]
    pub = Publisher(t.name("api", 1), t.tenant_id, mids)
    figures: dict = {}
    try:
        t.wait(lambda: any(x["ok"] for x in pub.lines), timeout=60)
        time.sleep(3)
        consumer = t.name("consumer", 1)
        containers.podman("kill", "-s", "KILL", consumer)
        time.sleep(1)
        containers.podman("start", consumer)
        time.sleep(4)
        nats_c = t.name("nats")
        containers.podman("kill", "-s", "KILL", nats_c)
        killed = time.monotonic()  # when podman kill returned: the server is gone
        time.sleep(3)
        started = time.monotonic()
        containers.podman("start", nats_c)
        t.wait(lambda: any(x["ok"] and x["t"] > started for x in pub.lines), timeout=90)
        back = min(x["t"] for x in pub.lines if x["ok"] and x["t"] > started)
        time.sleep(3)
    finally:
        stderr = pub.stop()
    lines = pub.lines
    acked = [x for x in lines if x["ok"]]
    outage = [x for x in lines if killed <= x["t"] and x["done"] < started]  # begun and ended while NATS was dead
    figures.update(published=len(lines), acknowledged=len(acked), not_acknowledged=len(lines) - len(acked),
                   not_acked_during_outage=sum(not x["ok"] for x in outage),
                   not_acked_before_kill=sum(not x["ok"] for x in lines if x["done"] < killed),
                   not_acked_after_start=sum(not x["ok"] for x in lines if x["t"] >= started), publish_errors=sorted(
                       {x["err"] for x in lines if x["err"]}),
                   acked_after_nats_start_s=round(back - started, 1))
    assert acked and outage, (figures, stderr)
    assert not any(x["ok"] for x in outage), f"acknowledged while NATS was dead: {figures}"
    assert any(x["ok"] and x["t"] > back for x in lines[-5:]), f"publishing did not resume: {figures}"
    # every acknowledged event applied (the consumers drain the stream, the killed one included after its start)
    t0 = time.monotonic()
    t.wait(lambda: {x["ev"]["id"] for x in acked} <= _stream_rows(t).keys(), timeout=120, poll=1)
    figures["applied_all_acked_after_s"] = round(time.monotonic() - t0, 1)
    rows = _stream_rows(t)
    figures["events_recorded"] = len(rows)
    figures["outcomes"] = dict(Counter(o for _, o, _ in rows.values()))
    # the stream survived the NATS kill (natsdata volume): its sequence went on after the restart, not again from 1
    seqs = [q for _, _, q in rows.values()]
    before = max(rows[x["ev"]["id"]][2] for x in acked if x["done"] < killed)
    after = min(rows[x["ev"]["id"]][2] for x in acked if x["t"] >= started)
    assert len(set(seqs)) == len(seqs) and after > before, ("the stream was not kept", before, after)
    figures["stream_seq_last_before_kill_first_after"] = (before, after)
    bad = {x["ev"]["id"]: (x["ev"]["kind"], rows[x["ev"]["id"]]) for x in acked
           if rows[x["ev"]["id"]][:2] != (x["mid"], "applied")}
    if bad:
        ids = ",".join(f"'{e}'" for e in list(bad)[:5])
        why = containers.podman("exec", t.name("postgres"), "psql", "-U", "olu", "-d", "olu", "-At", "-c",
                                f"SELECT event_id, convert_from(result, 'UTF8') FROM stream_events WHERE tenant_id = "
                                f"'{t.tenant_id}' AND event_id IN ({ids})", check=False).stdout
        raise AssertionError(f"acknowledged events not applied: {list(bad.items())[:5]} {why[-3000:]} {figures}")
    with httpx.Client(base_url=t.url, headers={"authorization": f"Bearer {key}"}, timeout=30) as c:
        for mid in mids:
            model = c.get(f"/v1/models/{mid}").json()
            receipts = all_receipts(c, mid)
            ledger = c.get(f"/v1/models/{mid}/ledger").json()
            mine = [x for x in lines if x["mid"] == mid]
            status = {}
            for x in mine:
                for rid in ([e["id"] for e in x["ev"]["body"]["examples"]] if x["ev"]["kind"] == "learn" else []):
                    r = c.get(f"/v1/audit/records/{rid}")
                    status[rid] = next((e["status"] for e in (r.json()["models"] if r.status_code == 200 else [])
                                        if e["model_id"] == mid), None)
            learned = [rid for x in mine if x["ok"] and x["ev"]["kind"] == "learn"
                       for rid in (e["id"] for e in x["ev"]["body"]["examples"])]
            forgot = [x["ev"]["body"]["ids"][0] for x in mine if x["ok"] and x["ev"]["kind"] == "unlearn"]
            assert all(status[rid] in ("learned", "forgotten") for rid in learned), "an acknowledged learn lost"
            assert all(status[rid] == "forgotten" for rid in forgot), "an acknowledged forget not applied"
            # once each: a record's learn counted once (steps 1..step without gaps), one receipt per forgotten record
            present = [rid for rid, st in status.items() if st in ("learned", "forgotten")]
            assert model["step"] == model["n_records"] == len(present), (model, figures)
            assert model["n_forgotten"] == len(receipts) == sum(st == "forgotten" for st in status.values()), model
            assert len({r["id"] for r in receipts}) == len({r["record_commitment"] for r in receipts}) == len(receipts)
            assert abs(ledger["rho_spent"] - sum(r["mechanism"]["rho"] for r in receipts)) < 1e-9, ledger
    # the workers are running after it all: the restarted one and the one that lived through the NATS kill
    for n in (1, 2):
        state = containers.podman("inspect", "-f", "{{.State.Status}} {{.RestartCount}}", t.name("consumer", n)).stdout
        assert state.split()[0] == "running", (n, state, t.logs())
        figures[f"consumer_{n}_state"] = state.strip()
    figures["not_acked_applied_anyway"] = sum(x["ev"]["id"] in rows for x in lines if not x["ok"])
    figures["kills"] = [consumer, nats_c]
    print(f"\ncompose broker kills: {figures}")
