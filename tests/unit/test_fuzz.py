"""The fuzzer without servers: the generator (valid, reproducible from a seed), the space's
input checks, the oracle on crafted record pairs (one per verdict), the shrinker on a fake
runner, the records and resume, and replay's case round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hseed

from workbench.config import ConfigError, ExperimentConfig
from workbench.findings import FINDINGS
from workbench.fuzz import attribute, oracle
from workbench.fuzz.command import parse_budget
from workbench.fuzz.hunt import Hunt
from workbench.fuzz.records import Book
from workbench.fuzz.scenario import Request, Scenario, scenarios
from workbench.fuzz.space import Space
from workbench.fuzz.trial import Trial

POOL = [[1, *range(10, 60)], [1, *range(100, 190)]]
SPACE = Space(max_requests=5, max_prompt_len=200)
SHAPE = SPACE.shapes(0)[0]


def draw(n: int, seed: int, shape: dict = SHAPE, space: Space = SPACE) -> list[Scenario]:
    out: list[Scenario] = []

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(scenarios(shape, space, POOL, 2048))
    def collect(sc):
        out.append(sc)

    collect()
    return out


# --- the generator ------------------------------------------------------------------------
def test_scenarios_are_valid_for_their_space_and_make_valid_configs():
    base = ExperimentConfig.for_profile("cpu")
    for sc in draw(40, 1, SPACE.shapes(3)[1]):
        assert 1 <= len(sc.requests) <= SPACE.max_requests
        for r in sc.requests:
            assert 1 <= len(r.tokens) <= SPACE.max_prompt_len
            assert all(0 <= t < 2048 for t in r.tokens)
            assert 2 <= r.max_tokens <= SPACE.max_new_tokens
            assert r.abort in SPACE.aborts
        delays = [r.delay_s for r in sc.requests]
        assert delays == sorted(delays) and delays[0] == 0.0
        cfg = sc.config(base)  # validated: a scenario the servers can be given
        assert cfg.kv_probe and cfg.num_prompts == len(sc.requests)
        assert cfg.block_size == sc.shape["block_size"]


def test_the_same_seed_draws_the_same_scenarios_and_another_seed_others():
    a, b, c = ([s.hash for s in draw(15, k)] for k in (7, 7, 8))
    assert a == b and a != c


def test_lengths_favour_block_multiples_and_prefixes_are_shared():
    scs = draw(60, 2)
    lengths = [len(r.tokens) for s in scs for r in s.requests]
    assert sum(n % 32 == 0 for n in lengths) > len(lengths) / 5  # uniform would give 1/32
    shared = sum(any(b.tokens[:32] == a.tokens[:32] for a in s.requests[:i])
                 for s in scs for i, b in enumerate(s.requests) if i and len(b.tokens) >= 32)
    assert shared > 0


def test_shapes_start_with_the_default_and_follow_the_seed():
    s = Space()
    assert s.shapes(0)[0] == {f: getattr(s, f)[0] for f in s.shapes(0)[0]}
    assert s.shapes(1) != s.shapes(2) and sorted(map(str, s.shapes(1))) == sorted(
        map(str, s.shapes(2)))


@pytest.mark.parametrize("data, says", [
    ({"k_pp": [1]}, "unknown fields ['k_pp']"),
    ({"block_size": [48]}, "multiples of 32"),
    ({"transfer": ["staged"]}, "allowed: direct, host-staged"),
    ({"aborts": []}, "non-empty list"),
    ({"knobs": {"block_handoff": "sideways"}}, "block_handoff"),
    ({"knobs": {"transfer": "host-staged"}}, "shape fields"),
    ({"max_requests": 0}, "whole number >= 1"),
])
def test_a_bad_space_is_refused_by_name(data, says):
    with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
        Space.from_dict(data)


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("20m", 1200), ("1h", 3600), ("45", 45)])
def test_budget_durations(text, seconds):
    assert parse_budget(text) == seconds


def test_a_bad_budget_names_the_value():
    with pytest.raises(ConfigError, match="--budget '20x'"):
        parse_budget("20x")


# --- the oracle -------------------------------------------------------------------------------
def counts(drafts=4, accepted=(3, 2, 1)):
    return {"num_drafts": drafts, "num_draft_tokens": 3 * drafts,
            "accepted_per_pos": list(accepted)}


def row(**over):
    probe = {"vs_p": {"identical": True}, "vs_baseline": {"identical": True}}
    r = {"id": "r0", "pd_tokens": [5, 6, 7], "baseline_tokens": [5, 6, 7], "pd": counts(),
         "baseline": counts(), "kv_probe": probe, "first_diff": None}
    r.update(over)
    return r


def test_identical_records_are_same():
    assert oracle.judge(row(), set(), {}).verdict == oracle.SAME


def test_a_comparison_that_could_not_be_made_is_unmeasured_never_same():
    """Missing counts, no probe record, a probe comparison missing its reference capture:
    each is ``unmeasured`` with why (it used to come out ``same``), and it ranks above
    explained and below unexplained in a trial."""
    for over, kind in (({"pd": None}, "counts"), ({"baseline": None}, "counts"),
                       ({"kv_probe": None}, "kv"),
                       ({"kv_probe": {"vs_p": {"identical": True}, "vs_baseline": {
                           "missing": "no capture of this prompt on the reference server"}}},
                        "kv_vs_baseline"),
                       ({"kv_probe": {"vs_baseline": {"identical": True}}}, "kv_vs_p")):
        j = oracle.judge(row(**over), set(), {})
        assert j.verdict == oracle.UNMEASURED and kind in j.unmeasured, (over, j)
    gap = oracle.judge(row(kv_probe=None), set(), {})
    told = oracle.judge(row(pd=counts(drafts=5)), set(), {"padded-load-step": ("drafts",)})
    bad = oracle.judge(row(pd_tokens=[1]), set(), {})
    assert oracle.trial_verdict([told, gap]) == oracle.UNMEASURED
    assert oracle.trial_verdict([gap, bad]) == oracle.UNEXPLAINED
    assert oracle.judge(row(), set(), {}).unmeasured == {}


def test_a_difference_the_two_baseline_runs_also_show_is_noise():
    r = row(pd_tokens=[5, 6, 8], first_diff=2)
    a = {"baseline_tokens": [5, 6, 9], "baseline": counts()}
    noisy = oracle.noise(a, r, None, None)
    assert noisy == {"tokens"}
    j = oracle.judge(r, noisy, {})
    assert j.verdict == oracle.NOISE and j.noise == ["tokens"] and not j.unexplained


def test_a_finding_explains_only_the_kinds_it_accounts_for():
    r = row(pd=counts(drafts=5))
    j = oracle.judge(r, set(), {"padded-load-step": ("drafts",)})
    assert j.verdict == oracle.EXPLAINED and j.explained == {"padded-load-step": ["drafts"]}
    r = row(pd=counts(drafts=5), kv_probe={"vs_p": {"identical": False, "groups_differing":
                                                     ["drafter"]}, "vs_baseline": {}})
    j = oracle.judge(r, set(), {"padded-load-step": ("drafts",)})
    assert j.verdict == oracle.UNEXPLAINED and list(j.unexplained) == ["kv_vs_p"]
    assert oracle.signature(j) == "kv_vs_p:drafter"


def test_the_signature_is_the_most_upstream_difference_with_its_groups():
    r = row(pd_tokens=[5, 9], first_diff=1, pd=counts(accepted=(3, 1, 0)),
            kv_probe={"vs_p": {"identical": False, "groups_differing": ["drafter", "target"]},
                      "vs_baseline": {"identical": True}})
    j = oracle.judge(r, set(), {})
    assert sorted(j.unexplained) == ["accepts", "kv_vs_p", "tokens"]
    assert oracle.signature(j) == "kv_vs_p:drafter+target"
    drafts = oracle.judge(row(pd=counts(drafts=5)), set(), {})
    assert oracle.signatures([j, drafts, j]) == ["drafts:more", "kv_vs_p:drafter+target"]
    assert oracle.trial_verdict([oracle.judge(row(), set(), {}), j]) == oracle.UNEXPLAINED


def test_a_probe_that_failed_anywhere_leaves_every_requests_kv_unmeasured():
    """Equal digests from a probe whose step hook raised are no evidence of equal KV."""
    j = oracle.judge(row(), set(), {}, ["before_step: KeyError: 'r3'"])
    assert j.verdict == oracle.UNMEASURED
    assert j.unmeasured == {"kv_probe_errors": "before_step: KeyError: 'r3'"}


@pytest.mark.parametrize("over,sig", [
    ({"pd_tokens": [9, 6, 7], "first_diff": 0}, "tokens:first"),
    ({"pd_tokens": [5, 6, 9], "first_diff": 2}, "tokens:later"),
    ({"pd": counts(accepted=(3, 3, 1))}, "accepts:more"),
    ({"pd": counts(accepted=(2, 2, 1))}, "accepts:fewer"),
    ({"pd": counts(accepted=(4, 1, 1))}, "accepts:mixed"),
    ({"pd": counts(drafts=3)}, "drafts:fewer"),
])
def test_a_signature_carries_its_detail_position_and_direction(over, sig):
    """D's tokens off at the first token are another failure than later ones; D accepting
    more than the baseline is another than accepting fewer."""
    assert oracle.signature(oracle.judge(row(**over), set(), {})) == sig


def test_attribution_uses_the_findings_own_detector_on_one_request():
    pd = counts(drafts=5)
    r = row(pd=pd, extra_pd_drafts=1, pd_spec={"per_step_accepted": [0, 3, 2, 1, 1]})
    found = attribute.present_in({"vllm_release": "0.32.0", "config": {
        "profile": "cpu", "knobs": {"connector": "nixl"}}}, r)
    assert found == {"padded-load-step": ("drafts",)}
    r["pd_spec"] = {"per_step_accepted": [2, 3, 2, 1, 1]}  # D accepted at its first step
    assert "padded-load-step" not in attribute.present_in({"config": {}}, r)


# --- the shrinker, on a fake runner ------------------------------------------------------------
def fake_runner(log: list):
    """Fails (tokens and KV against P) when a request's prompt is a block multiple of at least
    two blocks (the legacy hand-off's condition, made up for the fake); a prompt of exactly
    33 tokens fails another way (drafts only)."""
    def run(sc: Scenario) -> Trial:
        log.append(sc)
        judged = []
        for i, r in enumerate(sc.requests):
            n = len(r.tokens)
            bad = {"tokens": {}, "kv_vs_p": {"groups": ["target"]}} if n % 32 == 0 and n >= 64 \
                else {"drafts": {}} if n == 33 else {}
            judged.append(oracle.Judged(f"r{i}", oracle.UNEXPLAINED if bad else oracle.SAME,
                                        dict(bad), unexplained=dict(bad)))
        return Trial(sc, {"requests": []}, judged, seconds=0.01)
    return run


def test_the_hunt_shrinks_a_failure_to_one_minimal_request_and_records_it(tmp_path):
    log: list[Scenario] = []
    space = Space(max_requests=4, max_prompt_len=200, shape_trials=40,
                  budget_p=(None,), budget_d=(None,), k_p=(1,), block_size=(32,),
                  kv_cache_mib=(256,), padded_drafter_batch=(True,), transfer=("direct",))
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 3, "attribute": False})
    Hunt(book, space, fake_runner(log), None, budget_s=600, seed=3, pool=POOL).go()
    sig = "kv_vs_p:target"
    assert sig in book.failures and "drafts" in book.failures
    smallest = next(s for s in log if s.hash == book.failures[sig])
    assert [len(r.tokens) for r in smallest.requests] == [64]  # one request, two blocks
    other = next(s for s in log if s.hash == book.failures["drafts"])
    assert [len(r.tokens) for r in other.requests] == [33]
    assert all(r.abort == "none" and not r.d_first for r in smallest.requests)
    lines = [json.loads(x) for x in (tmp_path / "trials.jsonl").read_text().splitlines()]
    assert len(lines) == book.trials and {x["phase"] for x in lines} >= {"generate", "shrink"}
    assert f"unexplained: {sig}" in (tmp_path / "summary.md").read_text()


def test_a_finished_hunt_resumes_without_rerunning_and_a_different_one_is_refused(tmp_path):
    space = Space(max_requests=2, max_prompt_len=100, shape_trials=3, budget_p=(None,),
                  budget_d=(None,), k_p=(1,), block_size=(32,), kv_cache_mib=(256,),
                  padded_drafter_batch=(True,), transfer=("direct",))
    run = {"space": space.to_dict(), "seed": 0, "attribute": True}
    Hunt(Book.open(tmp_path, run), space, fake_runner([]), None, 600, pool=POOL).go()
    again: list[Scenario] = []
    book = Book.open(tmp_path, run)
    Hunt(book, space, fake_runner(again), None, 600, pool=POOL).go()
    assert again == [] and book.shapes_done == [0]
    with pytest.raises(ConfigError, match="another space, seed or attribution"):
        Book.open(tmp_path, {**run, "seed": 1})


def test_the_budget_stops_the_hunt(tmp_path):
    space = Space(shape_trials=1000)
    book = Book.open(tmp_path, {"space": space.to_dict(), "seed": 0, "attribute": True})
    log: list[Scenario] = []
    Hunt(book, space, fake_runner(log), None, budget_s=0.5, pool=POOL).go()
    assert 0 < len(log) < 1000 and book.spent() < 30


# --- replay ----------------------------------------------------------------------------------
def test_a_case_round_trips_through_json_with_its_hash():
    sc = Scenario(SHAPE, (Request((1, 2, 3), 8, 0.0, "during-d", True),), "pd-first",
                  {"block_handoff": "legacy"})
    back = Scenario.from_dict(json.loads(json.dumps(sc.to_dict())))
    assert back == sc and back.hash == sc.hash


def test_a_file_that_is_not_a_case_is_refused():
    with pytest.raises(ConfigError, match="not a fuzz case"):
        Scenario.from_dict({"shape": {}})


def test_a_space_longer_than_the_servers_model_length_is_refused_before_any_start():
    from workbench.fuzz.command import base_config_for, fits

    with pytest.raises(ConfigError, match="max_prompt_len=1000 .* exceeds the servers' "
                                          "max_model_len=1024"):
        fits(Space(max_prompt_len=1000), base_config_for())
    fits(Space(), base_config_for())


def test_attribution_keeps_the_earlier_requests_prompts_for_a_detector_that_needs_them():
    same = {"identical": True, "groups_differing": [], "positions_differing": {}}
    stale = {"identical": False, "groups_differing": ["drafter"],
             "positions_differing": {"model.layers.8.self_attn.attn": [[31, 31]]}}
    a = {"id": "r0", "prompt_token_ids": list(range(3, 35)), "prompt_len": 32,
         "kv_probe": {"vs_p": same, "vs_baseline": same}, "extra_pd_drafts": 0}
    b = {"id": "r1", "prompt_token_ids": list(range(3, 35)) + [7] * 32, "prompt_len": 64,
         "kv_probe": {"vs_p": stale, "vs_baseline": same}, "extra_pd_drafts": 0}
    result = {"vllm_release": "0.32.0",
              "config": {"profile": "cpu", "block_size": 32, "knobs": {"connector": "nixl"}},
              "requests": [a, b]}
    assert "prefix-cache-drafter-kv" in attribute.present_in(result, b)
    assert attribute.present_in(result, a) == {}
    one = attribute.narrowed(result, b)["requests"][0]
    assert set(one) == {"id", "prompt_token_ids", "prompt_len"}  # no measurement of r0


def test_only_the_builds_findings_and_regressions_re_created_by_their_knob_may_explain():
    def result(**knobs):
        return {"vllm_release": "0.32.0", "config": {"knobs": knobs}}

    plain = attribute.may_explain(result())
    assert {"padded-load-step", "prefix-cache-drafter-kv"} <= plain
    assert not plain & {"unclipped-handoff", "stale-last-block", "eager-finalize-host-staged"}
    assert "unclipped-handoff" in attribute.may_explain(result(block_handoff="legacy"))
    assert "eager-finalize-host-staged" not in attribute.may_explain(result(finalize="eager"))
    assert "eager-finalize-host-staged" in attribute.may_explain(
        result(finalize="eager", transfer="host-staged"))
    assert attribute.may_explain({"config": {}}) == set()  # no build: none may hide news


def test_attribution_cannot_hide_news():
    """A dev build's patched findings are absent there and explain nothing (the false-alarm
    run's attribution said otherwise); a finding never explains in its negative control's
    shape; a finding explains only the kinds it names; a table entry whose expectations file
    is missing stops the run instead of letting every finding explain."""
    dev = {"vllm_release": "0.32.0", "config": {"knobs": {}},
           "vllm_build": {"patches": ["chunked-prefill-drafter-kv.patch",
                                      "host-buffer-chunk-boundary.patch"]}}
    left = attribute.may_explain(dev)
    assert not left & {"chunked-prefill-drafter-kv", "host-buffer-chunk-boundary"}
    assert "padded-load-step" in left
    chunked = FINDINGS["chunked-prefill-drafter-kv"]
    assert attribute.in_negative_shape(chunked, {"padded_drafter_batch": False, "knobs": {}})
    assert not attribute.applies(chunked, {"profile": "cpu", "padded_drafter_batch": False,
                                           "knobs": {"connector": "nixl"}})
    assert attribute.applies(chunked, {"profile": "cpu", "padded_drafter_batch": True,
                                       "knobs": {"connector": "nixl"}})
    gated = {"profile": "cpu", "knobs": {"connector": "nixl", "load_step": "gated-async"}}
    assert not attribute.applies(FINDINGS["padded-load-step"], gated)
    from workbench.findings.finding import Finding

    assert Finding.__dataclass_fields__["explains"].default == ()
    # each names what it accounts for; the forward thread's affinity accounts for no difference
    assert {i for i, f in FINDINGS.items() if not f.explains} == {"nixl-cpu-forward-thread"}
    attribute.expected.cache_clear()
    with pytest.raises(ConfigError, match="expected-0.99.0.json"):
        attribute.may_explain({"vllm_release": "0.99.0", "config": {}})


def test_a_replay_that_finds_nothing_says_so_in_its_report_title():
    """``--replay`` of a case that now passes writes its records with a title that says the
    trial's verdict, not an unexplained ``None``."""
    from workbench.fuzz import failure

    sc = Scenario(SHAPE, (Request((1, 2, 3), 8, 0.0, "none", True),), "pd-first", {})
    same = Trial(sc, {"requests": []}, [oracle.Judged("r0", oracle.SAME, {})])
    cfg = ExperimentConfig.for_profile("cpu", require_models=False)
    text = failure.page(same, cfg, None, None)
    assert text.startswith("# Fuzz replay: same, no unexplained difference")
    assert "None" not in text.splitlines()[0]
    hit = Trial(sc, {"requests": []}, [oracle.Judged("r0", oracle.UNEXPLAINED, {"drafts": {}},
                                                     unexplained={"drafts": {}})])
    assert failure.page(hit, cfg, None, "drafts").startswith("# Fuzz: unexplained `drafts`")


def test_a_space_never_visits_a_shape_its_connector_cannot_take():
    """ExampleConnector has no host staging: a space listing both connectors and both
    transfers visits no ExampleConnector + host-staged shape (it used to die there, exit 2,
    after spending budget); a space whose first shape is such a one is refused up front."""
    s = Space(connector=("nixl", "example"))
    shapes = s.shapes(0)
    assert any(x["connector"] == "example" for x in shapes)
    assert not any(x["connector"] == "example" and x["transfer"] == "host-staged"
                   for x in shapes)
    import itertools

    from workbench.fuzz.space import SHAPE_FIELDS

    every = list(itertools.product(*(getattr(Space(), f) for f in SHAPE_FIELDS)))
    assert len(Space().shapes(0)) == len(every)  # the built-in space loses none
    with pytest.raises(ConfigError, match="host-staged.*connector='example'"):
        Space(connector=("example",), transfer=("host-staged", "direct"))


def test_an_unmeasured_trial_is_logged_and_summarised_as_such(tmp_path):
    """``trials.jsonl`` keeps what each request could not compare, and the summary counts the
    trial under ``unmeasured: <kind>``, not among the clean ones, every hit with its shape."""
    book = Book.open(tmp_path, {"space": {}, "seed": 0, "attribute": True})
    sc = Scenario(SHAPE, (Request((1, 2, 3), 8, 0.0, "none", True),), "pd-first", {})
    gap = Trial(sc, {"requests": []}, [oracle.judge(row(kv_probe=None), set(), {})])
    book.log(gap, 0, "generated")
    line = json.loads((tmp_path / "trials.jsonl").read_text().splitlines()[-1])
    assert line["verdict"] == oracle.UNMEASURED and line["unmeasured"] == {
        "r0": {"kv": "no KV probe record for this request"}}
    assert "| unmeasured: kv | 1 | 0 |" in book.summary()
    book.log(gap, 2, "generated")  # a later hit of a known kind is counted, with its shape
    assert "| unmeasured: kv | 2 | 0, 2 |" in book.summary()


def test_the_committed_power_table_is_what_the_benchmark_writes_from_its_records():
    """docs/fuzz.md's power table is ``fuzz_power.py --report``'s, from ``power.json`` and the
    runs' failure records (asked again with today's detectors), not typed in."""
    import importlib.util

    from workbench.paths import DATA, REPO

    spec = importlib.util.spec_from_file_location("fuzz_power",
                                                  REPO / "benchmarks" / "fuzz_power.py")
    power = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(power)
    out = DATA / "fuzz" / "power"
    doc = json.loads((out / "power.json").read_text())
    block = power.DOC.read_text().split(power.BEGIN, 1)[1].split(power.END, 1)[0]
    assert block.strip() == power.table(doc, out)
    assert "`eager-finalize-host-staged` 0.44 min" in block  # what the record says


def test_shapes_are_ordered_so_that_each_restarts_fewest_servers_after_the_one_before(tmp_path):
    """A shape change restarts only the roles whose server flags changed (``server_key``): P's
    budget or k P only, D's k D and the baseline, the block size all three. The hunt orders
    the seeded shapes so that the next one restarts fewest; the default shape stays first."""
    base = ExperimentConfig()
    hunt = Hunt(Book.open(tmp_path, {}), Space(), fake_runner([]), base, 600)
    restarts = hunt.restarts()
    first = Space().shapes(0)[0]
    assert restarts(first, {**first, "budget_p": 64}) == 1
    assert restarts(first, {**first, "k_p": 2}) == 1
    assert restarts(first, {**first, "transfer": "host-staged"}) == 2
    assert restarts(first, {**first, "block_size": 64}) == 3
    seeded, ordered = Space().shapes(4), Space().shapes(4, restarts)
    assert ordered[0] == seeded[0] == first
    assert sorted(map(str, ordered)) == sorted(map(str, seeded))  # the same shapes

    def total(shapes):
        return sum(restarts(a, b) for a, b in zip(shapes, shapes[1:], strict=False))

    assert total(ordered[:10]) < total(seeded[:10])
    assert restarts(ordered[0], ordered[1]) == 1  # a one-server change exists from the default
