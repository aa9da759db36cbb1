"""Crashes, HTTP errors and timeouts are failures of the fuzz run (``fuzz/crash.py``): each
gets a signature, is shrunk like any difference, is written under ``failures/`` with the
server's log, and makes the run exit 1. What failed in the workbench itself stays an error.
These are crafted exceptions and a fake runner; the live run over ExampleConnector is in
``tests/servers/test_fuzz_live.py``."""

from __future__ import annotations

import json

import httpx

from workbench.fuzz import crash, oracle
from workbench.fuzz.failure import write
from workbench.fuzz.hunt import Hunt
from workbench.fuzz.records import Book
from workbench.fuzz.scenario import Request, Scenario
from workbench.fuzz.space import Space
from workbench.fuzz.trial import Trial
from workbench.serving.servers import ServerError

POOL = [[1, *range(10, 60)], [1, *range(100, 190)]]
LOG = ("INFO 12-05 engine started\n"
       "(EngineCore pid=7) ERROR 12-05 [core.py:880] EngineCore encountered a fatal error.\n"
       "(EngineCore pid=7) ERROR 12-05 [core.py:880] Traceback (most recent call last):\n"
       "(EngineCore pid=7) ERROR 12-05 [core.py:880]   File \"/opt/x/lib/python3.11/site-"
       "packages/vllm/example_connector.py\", line 9\n"
       "(EngineCore pid=7) ERROR 12-05 [core.py:880] RuntimeError: shape mismatch: value "
       "tensor of shape [64] cannot be broadcast to [96]\n"
       "(APIServer pid=5) ERROR 12-05 [serving.py:1] InternalServerError: EngineCore died\n"
       + "INFO 12-05 shutting down\n" * 50)


class FakeServer:
    def __init__(self, role: str, port: int, alive: bool = True, log: str = LOG) -> None:
        self.url, self._alive, self._log = f"http://127.0.0.1:{port}", alive, log

    def alive(self) -> bool:
        return self._alive

    def output(self) -> str:
        return self._log


def servers(dead: tuple[str, ...] = ()) -> dict[str, FakeServer]:
    return {r: FakeServer(r, 8000 + i, r not in dead)
            for i, r in enumerate(("p", "d", "baseline"))}


def http_error(url: str, status: int = 500) -> httpx.HTTPStatusError:
    req = httpx.Request("POST", f"{url}/v1/completions")
    return httpx.HTTPStatusError("boom", request=req,
                                 response=httpx.Response(status, text="Internal", request=req))


def test_a_dead_d_is_a_crash_of_d_with_the_servers_last_error_line():
    s = servers(dead=("d",))
    e = httpx.RemoteProtocolError("Server disconnected",
                                  request=httpx.Request("POST", f"{s['d'].url}/v1/completions"))
    c = crash.classify(e, s)
    assert c.signature == "crash:d"
    assert c.line.startswith("RuntimeError: shape mismatch")  # the engine core's, the cause
    assert c.log_tail.startswith("(EngineCore pid=7) ERROR 12-05 [core.py:880] Traceback")
    assert "RuntimeError: shape mismatch" in c.log_tail  # the cause, before 50 shutdown lines
    assert 'File "vllm/example_connector.py"' in c.log_tail  # no path of the machine


def test_a_dead_server_is_named_even_when_another_saw_the_symptom():
    s = servers(dead=("d",))
    assert crash.classify(http_error(s["p"].url), s).signature == "crash:d"


def test_an_http_error_from_a_live_server_is_its_crash():
    s = servers()
    s["p"]._log = "INFO all well\n"  # no error line: the client's words are kept
    c = crash.classify(http_error(s["p"].url), s)
    assert (c.signature, c.line) == ("crash:p", "HTTP 500: Internal")


def test_a_request_past_its_deadline_is_a_timeout_of_the_server_asked():
    s = servers()
    e = httpx.ReadTimeout("timed out",
                          request=httpx.Request("POST", f"{s['baseline'].url}/v1/completions"))
    assert crash.classify(e, s).signature == "timeout:baseline"


def test_the_workbenchs_own_failure_is_no_crash_of_vllm():
    assert crash.classify(KeyError("kv_probe"), servers()) is None


def test_a_server_that_could_not_start_is_named_from_the_start_error():
    e = ServerError("d server exited with code 1 during start-up; log x:\n"
                    "ValueError: unsupported flag combination")
    c = crash.classify(e, {}, "start")
    assert c.signature == "start:d" and c.line == "ValueError: unsupported flag combination"


def one_shape_space(**kw) -> Space:
    return Space(budget_p=(None,), budget_d=(None,), k_p=(1,), block_size=(32,),
                 kv_cache_mib=(256,), padded_drafter_batch=(True,), transfer=("direct",),
                 **kw)


def crashing_runner(log: list):
    """D dies whenever a request's prompt reaches 64 tokens (a made-up condition)."""
    def run(sc: Scenario) -> Trial:
        log.append(sc)
        if any(len(r.tokens) >= 64 for r in sc.requests):
            c = crash.Crash("crash", "d", "RuntimeError: shape mismatch", LOG)
            return Trial(sc, {}, error="RemoteProtocolError: Server disconnected", crash=c)
        return Trial(sc, {"requests": []}, [oracle.Judged(f"r{i}", oracle.SAME)
                                            for i in range(len(sc.requests))])
    return run


def test_a_crash_is_a_failure_shrunk_to_one_request_and_written_with_the_log(tmp_path):
    log: list[Scenario] = []
    space = one_shape_space(max_requests=4, max_prompt_len=200, shape_trials=30)
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 1, "attribute": True})
    Hunt(book, space, crashing_runner(log), None, 600, seed=1, pool=POOL).go()
    assert list(book.failures) == ["crash:d"]
    smallest = next(s for s in log if s.hash == book.failures["crash:d"])
    assert [len(r.tokens) for r in smallest.requests] == [64]
    lines = [json.loads(x) for x in (tmp_path / "trials.jsonl").read_text().splitlines()]
    hit = next(x for x in lines if x["verdict"] == oracle.CRASH)
    assert hit["signatures"] == ["crash:d"] and hit["crash"]["line"].startswith("RuntimeError")
    assert "unexplained: crash:d" in book.summary()
    assert not any(k.startswith("error") for k in book.hits)


def test_a_crash_is_written_with_the_servers_log(tmp_path):
    from workbench.fuzz.command import base_config_for

    sc = Scenario(one_shape_space().shapes(0)[0], (Request(tuple(POOL[0]), 4, 0.0, "none",
                                                           False),), "baseline-first", {})
    c = crash.Crash("crash", "d", "RuntimeError: shape mismatch", LOG)
    d = write(tmp_path, Trial(sc, {}, error="RemoteProtocolError: gone", crash=c),
              base_config_for())
    page = (d / "report.md").read_text()
    assert "the d server died or answered an error: `RuntimeError: shape mismatch`" in page
    assert "EngineCore encountered a fatal error" in page and "#16928" in page
    assert json.loads((d / "records.json").read_text())["crash"]["signature"] == "crash:d"


def test_a_server_that_cannot_start_fails_the_shape_once_without_shrinking(tmp_path):
    runs: list[Scenario] = []

    def run(sc: Scenario) -> Trial:
        runs.append(sc)
        return Trial(sc, {}, error="servers: d server exited",
                     crash=crash.Crash("start", "d", "ValueError: refused"))

    space = one_shape_space(shape_trials=5)
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 0, "attribute": True})
    Hunt(book, space, run, None, 600, pool=POOL).go()
    assert list(book.failures) == ["start:d"] and len(runs) == 1


def test_an_instrument_error_alone_stays_an_error_and_fails_nothing(tmp_path):
    space = one_shape_space(shape_trials=2)
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 0, "attribute": True})
    Hunt(book, space, lambda sc: Trial(sc, {}, error="KeyError: 'kv_probe'"), None, 600,
         pool=POOL).go()
    assert book.failures == {} and book.trials == 2
    assert book.hits["error (the workbench's instruments failed; trials.jsonl has each)"].trials \
        == 2
    line = json.loads((tmp_path / "trials.jsonl").read_text().splitlines()[0])
    assert line["verdict"] == oracle.ERROR and line["crash"] is None


def test_a_failure_hypothesis_did_not_shrink_is_reduced_to_the_one_request_that_shows_it(
        tmp_path):
    """Hypothesis's shrinker stopped at three requests (its time up: each try of a crash
    restarts D): the failure is still written at the one request that shows it alone."""
    log: list[Scenario] = []
    space = one_shape_space()
    shape = space.shapes(0)[0]
    reqs = tuple(Request(tuple(POOL[1][:n]), 4) for n in (40, 80, 50))
    run = crashing_runner(log)
    t = run(Scenario(shape, reqs))
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 0, "attribute": True})
    Hunt(book, space, run, None, 600, pool=POOL).found("crash:d", t, {}, 0)
    written = next(s for s in log if s.hash == book.failures["crash:d"])
    assert [len(r.tokens) for r in written.requests] == [80]
    phases = [json.loads(x)["phase"]
              for x in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert phases == ["alone", "alone"]  # the first request alone passed, the second failed


def test_the_committed_example_connector_run_found_ds_crash_at_one_request():
    """``fuzz --space data/fuzz/example-crash-0.32.0/space.json`` (ExampleConnector, P's
    budget 64 below the prompts): D's shape-mismatch death, shrunk to one request."""
    from workbench.paths import DATA

    d = DATA / "fuzz" / "example-crash-0.32.0"
    case = d / "failures" / json.loads((d / "state.json").read_text())["failures"]["crash:d"]
    rec = json.loads((case / "records.json").read_text())
    assert rec["signature"] == "crash:d" and rec["crash"]["role"] == "d"
    assert rec["crash"]["line"].startswith("RuntimeError: shape mismatch")
    assert len(json.loads((case / "case.json").read_text())["requests"]) == 1
    assert "example_connector.py" in (case / "report.md").read_text()


def test_the_summary_says_the_result_first(tmp_path):
    space = one_shape_space(max_requests=4, max_prompt_len=200, shape_trials=30)
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 1, "attribute": True})
    Hunt(book, space, crashing_runner([]), None, 600, seed=1, pool=POOL, shrink_s=0).go()
    first = book.summary().splitlines()[2]
    crashed, same = book.verdicts["crash"], book.verdicts.get("same", 0)
    assert first == (f"{book.trials} trials: {crashed} unexplained, 0 explained, {same} same, "
                     "0 unmeasured")


def test_no_shape_is_started_when_the_budget_left_is_less_than_the_last_start(tmp_path):
    """The shape's first trial waited 100 s for its servers (the others none) and 50 s are
    left: the next shape would spend the rest starting and run nothing."""
    space = Space(shape_trials=2, budget_p=(None, 64), budget_d=(None,), k_p=(1,),
                  block_size=(32,), kv_cache_mib=(256,), padded_drafter_batch=(True,),
                  transfer=("direct",))
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 0, "attribute": True})
    ran: list[Scenario] = []

    def run(sc: Scenario) -> Trial:
        ran.append(sc)
        return Trial(sc, {"requests": []}, [oracle.Judged("r0", oracle.SAME)],
                     start_seconds=100.0 if len(ran) == 1 else 0.1)

    hunt = Hunt(book, space, run, None, budget_s=150, pool=POOL)
    book.elapsed_s = 100.0  # spent before this shape
    hunt.go()
    assert len(ran) == 2 and book.shapes_done == [0]
    assert book.stopped.startswith("Stopped before shape 1: 50 s of budget left, less than "
                                   "the longest server start so far (100 s)")
    summary = book.summary().splitlines()
    assert summary[2] == "2 trials: 0 unexplained, 0 explained, 2 same, 0 unmeasured"
    assert summary[4] == book.stopped


def test_every_hits_smallest_case_is_kept_for_replay(tmp_path):
    space = one_shape_space(max_requests=4, max_prompt_len=200, shape_trials=30)
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 1, "attribute": True})
    Hunt(book, space, crashing_runner([]), None, 600, seed=1, pool=POOL, shrink_s=0).go()
    for h in book.hits.values():
        case = tmp_path / "cases" / f"{h.smallest['hash']}.json"
        assert Scenario.from_dict(json.loads(case.read_text())).hash == h.smallest["hash"]
    assert "--replay DIR/cases/<hash>.json" in book.summary()
